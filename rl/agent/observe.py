"""Running an action and telling the policy what happened.

The policy's code runs in the episode's own sandbox (a resident snippet),
after the task's prompt (for its imports), with the task's *visible*
examples: never the hidden tests, which only the verifier runs, in a fresh
sandbox. The observation shows what the code printed, its traceback, and
each example that failed, cut to a token budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rl.agent.tools import cut
from rl.tasks.format import Task
from sandboxes.config import Limits

MARKER = "@@SARL-AGENT@@"

# Runs inside the sandbox (stdlib only). The result line's "@" are escaped, so
# nothing the code prints can forge it (as in rl/verify/runner.py).
RUN_EXAMPLES = r"""
import json, sys, traceback
P = globals()["PARAMS"]
ns = {"__name__": "__solution__"}
result = {"loaded": False, "examples": []}
try:
    exec(compile(P["source"], "solution.py", "exec"), ns)
    result["loaded"] = True
except BaseException:
    traceback.print_exc()
if result["loaded"]:
    for call, expected in P["examples"]:
        try:
            got = eval(call, ns)
            ok = got == eval(expected, dict(ns))
            result["examples"].append([call, expected, repr(got)[:200], bool(ok)])
        except BaseException as e:
            result["examples"].append([call, expected, "%s: %s" % (type(e).__name__, str(e)[:150]), False])
sys.stdout.flush()
sys.stdout.write("\n" + "@@SARL-AGENT@@" + json.dumps(result).replace("@", "\\u0040") + "\n")
"""


@dataclass
class Outcome:
    """What one run of the policy's code did."""

    loaded: bool = False
    """The code (after the prompt) ran to its end without an exception."""
    examples: list[tuple[str, str, str, bool]] = field(default_factory=list)
    """(call, expected, what it gave, passed) per visible example."""
    stdout: str = ""
    stderr: str = ""
    limit: str | None = None
    """A sandbox limit that cut the run (wall_time, memory, output, ...)."""
    seconds: float = 0.0

    @property
    def all_pass(self) -> bool:
        return self.loaded and self.limit is None and all(ok for *_, ok in self.examples)


def run_action(sandbox: Any, task: Task, code: str, run_s: float) -> Outcome:
    """Run `code` with the task's examples in `sandbox` (the episode's: what it wrote stays)."""
    params = {"source": task.prompt + "\n" + code + "\n", "examples": [[e.call, e.expected] for e in task.examples]}
    # wall time is the limit an episode lives by; CPU time may run at twice
    # its pace on two cores, so its bound is set where only threads reach it
    limits = Limits(wall_s=run_s, cpu_s=2 * run_s, memory_mb=task.limits.memory_mb)
    r = sandbox.run_snippet(RUN_EXAMPLES, limits=limits, globals={"PARAMS": params}, cache=True)
    out = r.stdout.decode(errors="replace")
    head, sep, last = out.rstrip("\n").rpartition("\n" + MARKER)
    result: dict[str, Any] = {}
    if sep:
        try:
            result = json.loads(last)
        except ValueError:
            result = {}
    else:
        head = out
    return Outcome(
        loaded=bool(result.get("loaded")),
        examples=[tuple(x) for x in result.get("examples", [])],  # type: ignore[misc]
        stdout=head,
        stderr=r.stderr.decode(errors="replace"),
        limit=r.limit,
        seconds=r.duration_s,
    )


def describe(outcome: Outcome, has_code: bool) -> str:
    """The observation text, before the token budget is applied."""
    if not has_code:
        return "I found no ```python code block in your reply. Reply with the whole function in one ```python block."
    parts = []
    if outcome.limit:
        parts.append(f"Your code was stopped: it hit the {outcome.limit.replace('_', ' ')} limit.")
    if outcome.stdout.strip():
        parts.append("Output:\n" + outcome.stdout.strip())
    if outcome.stderr.strip():
        parts.append("Error:\n" + outcome.stderr.strip())
    if outcome.loaded and outcome.examples:
        failed = [x for x in outcome.examples if not x[3]]
        parts.append(f"Examples: {len(outcome.examples) - len(failed)} of {len(outcome.examples)} passed.")
        parts += [f"  {call}: expected {expected}, got {got}" for call, expected, got, _ in failed[:5]]
    elif outcome.loaded:
        parts.append("Your code ran.")
    return "\n".join(parts)


def fit(text: str, tokenizer: Any, budget: int) -> str:
    """`text` cut in the middle to at most about `budget` tokens."""
    return cut(text, tokenizer, budget)[0]
