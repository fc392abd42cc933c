"""A task as the first messages of an episode."""

from __future__ import annotations

from rl.agent.config import AgentConfig
from rl.tasks.format import Task


def first_messages(task: Task, cfg: AgentConfig) -> list[dict[str, str]]:
    """The system message (the protocol) and the task as a user message."""
    user = "Complete the following Python function.\n```python\n" + task.prompt.rstrip() + "\n```"
    return [{"role": "system", "content": cfg.system_prompt}, {"role": "user", "content": user}]
