"""The `[agent]` section: the tool protocol and its budgets (pydantic only)."""

from __future__ import annotations

from pydantic import Field, field_validator

from rl.engine.config import MAX_TEMPERATURE, MIN_TEMPERATURE, MIN_TOP_P
from rl.schema import Section

SYSTEM_PROMPT = (
    "You are a careful Python programmer. Solve the task by writing the whole function "
    "in one ```python code block.\n"
    "After each reply, your code is run with the examples from the task, and you see what it "
    "printed and which examples failed.\n"
    "If an example fails, reply with a corrected ```python code block. When every example passes, "
    "your last code block is your answer."
)


class AgentConfig(Section):
    """How an episode talks to the policy: prompts, turns and budgets."""

    system_prompt: str = SYSTEM_PROMPT
    """The system message: it explains the protocol (one ```python block per reply)."""
    max_turns: int = Field(3, ge=1, le=32)
    """Replies the policy may give; 1 is plain single-turn RL."""
    max_tokens: int = Field(384, ge=8)
    """Tokens the policy may sample per reply."""
    temperature: float = Field(0.8, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    """Sampling temperature of each reply: 0 (greedy), or between 0.01 and 100."""
    top_p: float = Field(1.0, ge=MIN_TOP_P, le=1.0, allow_inf_nan=False)
    """Nucleus sampling mass, between 1e-6 and 1."""
    observation_tokens: int = Field(256, ge=16)
    """Tokens an observation may take at most; longer output is cut in the middle."""
    stop_when_examples_pass: bool = True
    """End the episode as soon as the code passes every visible example."""
    run_s: float = Field(5.0, gt=0)
    """Seconds one run of the policy's code with the examples may take."""

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if 0.0 < v < MIN_TEMPERATURE:
            raise ValueError(f"{v!r} is neither 0 (greedy) nor between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}")
        return v
