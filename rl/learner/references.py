"""SFT on the tasks' references: what a step trains on when `[learner.loss]
type = "sft"`, `source = "references"`.

Each task with a reference becomes one sample: the prompt an episode
starts with (rl.agent.prompts), then the reply the protocol asks for (the
whole function, in one python block) and the end of turn, the reply alone
trained. With `repairs`, that share of the samples of tasks that carry a
wrong attempt (rl.tasks.repairs) is a repair trace instead: the prompt, the
wrong attempt, the observation the agent would show after it, then the
reference; only the reference is trained. Step s takes `samples_per_step` of them in an order that a seeded
shuffle of each pass over the file fixes, so the data of a step follows
from the run seed and the step alone: a resumed learner trains on what the
interrupted one would have, with no cursor of its own.
"""

from __future__ import annotations

import ast
import random
from typing import Any

import numpy as np

from rl.agent.config import AgentConfig
from rl.agent.prompts import first_messages
from rl.model import chat_ids
from rl.store import Sample
from rl.tasks.format import Task, read_tasks


def reference_reply(task: Task) -> str:
    """The whole function in a python block, without the entry point's
    docstring: the model need not copy the task back (on generated tasks
    the docstring was half of each reply's tokens)."""
    return "```python\n" + _without_docstring((task.prompt + task.reference).strip("\n"), task.entry_point) + "\n```"


def _without_docstring(code: str, name: str) -> str:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    lines = code.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name and len(node.body) > 1:
            doc = node.body[0]
            if not (
                isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
            ):
                return code
            end = doc.end_lineno or doc.lineno
            # only a docstring that has its lines to itself
            if lines[doc.lineno - 1].strip()[:1] in "\"'rRuUbBfF" and lines[end - 1].rstrip().endswith(('"', "'")):
                return "\n".join(lines[: doc.lineno - 1] + lines[end:])
            return code
    return code


def repair_observation(task: Task) -> str | None:
    """What the agent would have shown after the task's stored wrong attempt
    (`metadata.repair`, rl.tasks.repairs), rendered by the agent's own code."""
    from rl.agent.observe import Outcome, describe

    rep = task.metadata.get("repair")
    if not isinstance(rep, dict) or not rep.get("attempt"):
        return None
    examples = [(str(c), str(e), str(g), bool(ok)) for c, e, g, ok in rep.get("examples", [])]
    return describe(Outcome(loaded=True, examples=examples), has_code=True)


class Epochs:
    """Fixed SFT data, taken in passes: step s takes `n` items in the order a
    seeded shuffle of each pass fixes, so a step's data follows from the run
    seed and the step alone."""

    seed: int
    _orders: dict[int, list[int]]

    def __len__(self) -> int:
        raise NotImplementedError

    def item(self, k: int, index: int) -> Sample:
        """Item `k` as the `index`-th sample of the run."""
        raise NotImplementedError

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self)))
            random.Random(f"{self.seed}/sft/{epoch}").shuffle(order)
            self._orders[epoch] = order
        return self._orders[epoch]

    def step(self, step: int, n: int) -> list[Sample]:
        """The `n` samples of learner step `step` (0-based)."""
        out = []
        for i in range(step * n, (step + 1) * n):
            epoch, k = divmod(i, len(self))
            out.append(self.item(self._order(epoch)[k], i))
        return out


class References(Epochs):
    def __init__(
        self, path: Any, tokenizer: Any, agent: AgentConfig, seed: int, max_tokens: int = 2048, repairs: float = 0.0
    ):
        self.tasks = [t for t in read_tasks(path) if t.reference.strip()]
        if not self.tasks:
            raise ValueError(f"{path}: no task has a reference to train on")
        self.tokenizer, self.agent, self.seed, self.max_tokens = tokenizer, agent, seed, max_tokens
        self.repairs = repairs
        """The share of samples given as a repair trace (where the task has one)."""
        self._orders = {}

    def __len__(self) -> int:
        return len(self.tasks)

    def item(self, k: int, index: int) -> Sample:
        return self.sample(self.tasks[k], index)

    def _reply(self, messages: list[dict[str, str]], prompt: list[int], text: str) -> list[int]:
        """The ids of assistant reply `text` after `prompt` (the chat template
        of `messages` with its generation prompt), up to its end of turn."""
        whole = chat_ids(self.tokenizer, [*messages, {"role": "assistant", "content": text}], False)
        # the template renders the reply after the prompt's tokens; cut what it adds after the end of turn
        reply = whole[len(prompt) :]
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end, int) and end in reply:
            reply = reply[: reply.index(end) + 1]
        return reply

    def sample(self, task: Task, index: int) -> Sample:
        if task.test_format == "text":  # the text environment's episode: its messages, the expected text
            from rl.agent import text

            messages = text.first_messages(task)
            prompt = chat_ids(self.tokenizer, messages)
            return self._sample(task, index, prompt, self._reply(messages, prompt, task.reference))
        messages = first_messages(task, self.agent)
        prompt = chat_ids(self.tokenizer, messages)
        context = list(prompt)
        observation = repair_observation(task) if self.repairs else None
        if observation is not None and random.Random(f"{self.seed}/repair/{index}").random() < self.repairs:
            # the wrong attempt and its observation are context (mask 0), assembled as an
            # episode assembles them (rl.agent.tokens): the attempt's ids, then the user turn
            from rl.agent.tokens import ObservationTokens

            attempt = self._reply(messages, prompt, "```python\n" + task.metadata["repair"]["attempt"] + "\n```")
            context += attempt + ObservationTokens(self.tokenizer).after_reply(attempt, observation)
        return self._sample(task, index, context, self._reply(messages, prompt, reference_reply(task)))

    def _sample(self, task: Task, index: int, context: list[int], reply: list[int]) -> Sample:
        ids = (context + reply)[: self.max_tokens]
        mask = ([0] * len(context) + [1] * len(reply))[: self.max_tokens]
        return Sample(
            task.task_id,
            index,
            0,
            np.asarray(ids, dtype=np.int32),
            np.asarray(mask, dtype=np.uint8),
            np.zeros(len(ids), dtype=np.float32),
            reward=1.0,
            episode_id=f"reference/{index}",
        )
