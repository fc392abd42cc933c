"""The `text` environment: rewrite a short text as the task asks, in the
reply itself (no code, no tools), graded by the LCS ratio of the answer to
the expected text (rl.tasks.texts, rl.verify.formats). One reply: the
episode ends with it."""

from __future__ import annotations

import re

from rl.agent.env import Environment, Final, Start, Step
from rl.tasks.format import Task

SYSTEM_PROMPT = "Follow the instruction exactly. Reply with the resulting text alone, on one line."

_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.S)


def answer_of(reply: str) -> str:
    """The answer in a reply: inside its first <answer> tags when it has
    them, else the whole reply; stripped."""
    m = _TAGGED.search(reply)
    return (m.group(1) if m else reply).strip()


def first_messages(task: Task) -> list[dict[str, str]]:
    """The system message and the task: what an episode starts with (and
    what SFT on references puts before the expected text)."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.prompt}]


class TextEnv(Environment):
    """One reply, graded on its text."""

    answer = ""

    def reset(self, task: Task) -> Start:
        return Start(first_messages(task))

    def step(self, reply: str, last: bool) -> Step:
        self.answer = answer_of(reply)
        return Step(done=True, end="answered")

    def final(self) -> Final:
        return Final(self.answer)

    def verify(self, final: Final) -> object:
        return self.ctx.verifier.verify(self.ctx.task, final.completion)
