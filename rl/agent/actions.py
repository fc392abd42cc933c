"""What the policy asked for, parsed from its reply.

The protocol (rl.agent.config.SYSTEM_PROMPT): each reply holds one
```python code block, the whole function. Small models are sloppy, so the
parser takes, in order:

  1. the last fenced block tagged python (py, python3), else
  2. the last fenced block of any tag, else
  3. an unclosed fence: everything after it, else
  4. the reply from its first line that starts Python code (def, import,
     from, class, @) to its end, prose lines after the code dropped.

Several blocks: the last one wins (a model that revises in one reply writes
the corrected version last). No code at all: the action is empty, and the
observation says what the protocol wants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
_CODE_START = re.compile(r"^(def |async def |import |from \S+ import |class |@)")


@dataclass(frozen=True)
class Action:
    """The policy's reply, as the agent reads it."""

    code: str
    """The Python code to run; empty when the reply held none."""
    how: str
    """Which rule found it: python-block, block, open-fence, bare-code or none."""


def parse_action(reply: str) -> Action:
    blocks = _FENCE.findall(reply)
    python = [body for tag, body in blocks if tag.lower() in ("python", "py", "python3")]
    if python:
        return Action(python[-1].strip("\n"), "python-block")
    if blocks:
        return Action(blocks[-1][1].strip("\n"), "block")
    opened = reply.rfind("```")
    if opened >= 0:
        rest = reply[opened + 3 :].split("\n", 1)
        body = rest[1] if len(rest) > 1 else ""
        if body.strip():
            return Action(body.strip("\n"), "open-fence")
    lines = reply.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return Action("", "none")
    code = lines[start:]
    # prose after the code: the last line that is indented, blank, or code-like ends it
    end = len(code)
    while (
        end > 1
        and code[end - 1].strip()
        and not code[end - 1].startswith((" ", "\t"))
        and not _CODE_START.match(code[end - 1])
    ):
        end -= 1
    return Action("\n".join(code[:end]).rstrip("\n"), "bare-code")


def as_completion(prompt: str, code: str) -> str:
    """The action as a completion of `prompt` for the verifier (which runs
    `prompt + completion`): the whole function, after the prompt's own
    signature and docstring, redefines it."""
    return "\n" + code + "\n" if code else ""
