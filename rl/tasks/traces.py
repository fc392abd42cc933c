"""Tool traces from references: a correct trajectory of a tool task, in the
episode's own format, for a warm start that teaches the tools.

A trace is the policy's replies, one a turn, each a short sentence and a
tool call in the one call format (rl.agent.tools: a JSON object between
`<tool_call>` tags); the observations between them are not part of it:
replaying the trace in the task's environment (rl.episodes.replay) makes
them, so a trace is checked by the environment itself and must score 1.

    SQL        run the reference query with `sql`, read its rows, `answer` it
    workspace  read the module and its test file, run the visible tests,
               `edit_file` the lines that differ from the reference (the def
               line and docstring stay as they are), run the tests again,
               `submit`

The `repair` variant takes a wrong step first and then repairs it:

    SQL        a query on a column the table does not have (an error), then on
               with the direct trace
    workspace  edit to a wrong version (`first_attempt` in the task's
               metadata: for implement the function's planted bug, for fix
               and make-pass another bug or a small mutation of the
               reference), run the tests, see them fail, then edit to the
               reference

The `refused` variant (workspace) answers a refused tool call: its first edit
gives the old text with its indentation wrong (lost, or in tabs), as a model
that retypes the lines rather than copying them does; `edit_file` refuses it ("the old text
is not in the file"), and the next reply says why and gives the edit with
the old text copied exactly, then goes on as the direct trace.

The wrong step is context, not trained (`Trace.untrained`): the warm start
learns to read a failure and repair it, not to make the mistake first.

Which tasks get a repair and a refused trace is drawn from the task id
(`repair_share`, `refused_share`), so a file's traces are the same on every
machine.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rl.errors import SarlError
from rl.tasks.format import LineErrors, Task, TaskError

KINDS = ("direct", "repair", "refused")
Kind = Literal["direct", "repair", "refused"]
TOOL_FORMATS = ("sql", "workspace")
"""The test formats (environments) that have traces."""


class TraceError(SarlError, ValueError):
    """A tool task whose reference gives no trace; the message names the task and why."""

    exit_code = 2


@dataclass(frozen=True)
class Trace:
    """One correct trajectory of a task: the policy's replies, in order."""

    task_id: str
    kind: Kind
    replies: list[str] = field(default_factory=list)
    untrained: tuple[int, ...] = ()
    """Indices of the replies that are context, not trained: a repair's wrong step, a refused edit."""

    def to_json(self) -> dict[str, object]:
        return {"task_id": self.task_id, "kind": self.kind, "replies": self.replies, "untrained": list(self.untrained)}


def call(name: str, **arguments: object) -> str:
    """One tool call in the episode's format."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _drawn(kind: str, task_id: str, share: float) -> bool:
    digest = hashlib.sha256(f"{kind}/{task_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < share


def traces(task: Task, repair_share: float = 0.3, refused_share: float = 0.0) -> list[Trace]:
    """The direct trace of a tool task, then its repair and its refused trace
    where the task has one and is drawn for it; [] for a task of another
    format."""
    if task.test_format == "sql":
        make = _sql
    elif task.test_format == "workspace" and task.metadata.get("function"):
        make = _workspace
    else:
        return []
    can = {
        "repair": lambda: task.test_format == "sql" or "first_attempt" in task.metadata,
        "refused": lambda: task.test_format == "workspace" and _retyped(task) is not None,
    }
    shares: tuple[tuple[Kind, float], ...] = (("repair", repair_share), ("refused", refused_share))
    try:
        out = [Trace(task.task_id, "direct", *make(task, "direct"))]
        for kind, share in shares:
            if _drawn(kind, task.task_id, share) and can[kind]():
                out.append(Trace(task.task_id, kind, *make(task, kind)))
    except TraceError:
        raise
    except ValueError as e:  # rl.tasks.traces.edit: two texts no edit turns one into the other
        raise _no_trace(task, str(e)) from None
    return out


def _no_trace(task: Task, why: str) -> TraceError:
    return TraceError(f"{task.task_id}: no trace from its reference: {why}")


def _module(task: Task) -> tuple[str, str, str, str]:
    """A workspace task's module path, its content as given and as its
    reference writes it, and its visible test file; TraceError where the
    task does not have them, or its module already is the reference."""

    try:
        patch = json.loads(task.reference)
    except ValueError:
        raise _no_trace(task, "reference: not a JSON object {path: content}") from None
    if not isinstance(patch, dict) or len(patch) != 1 or not all(isinstance(v, str) for v in patch.values()):
        raise _no_trace(task, "reference: one file, {path: content}, is what a trace edits")
    [(path, fixed)] = patch.items()
    if path not in task.files:
        raise _no_trace(task, f"reference: {path} is not one of the task's files")
    test = next((p for p in sorted(task.files) if p.startswith("tests/test_") and p.endswith(".py")), None)
    if test is None:
        raise _no_trace(task, "files: no tests/test_*.py for the trace to run")
    if task.files[path] == fixed:
        raise _no_trace(task, f"files: {path} already is its reference, so there is nothing to edit")
    return path, task.files[path], fixed, test


# Each maker returns the trace's replies and the indices of those left untrained.


def _sql(task: Task, kind: Kind) -> tuple[list[str], tuple[int, ...]]:
    query = task.reference.strip()
    if not query:
        raise _no_trace(task, "reference: no query")
    replies: list[str] = []
    untrained: tuple[int, ...] = ()
    if kind == "repair":
        untrained = (0,)  # the bad query
        table = re.search(r"\bFROM\s+(\w+)", query, re.I)
        wrong = f"SELECT missing_column FROM {table.group(1) if table else 'data'} LIMIT 5"
        replies.append("Let me look at the data first.\n" + call("sql", query=wrong))
        replies.append("That column does not exist; the schema above has the right names.\n" + call("sql", query=query))
    else:
        replies.append("Let me run a query for the question and check its rows.\n" + call("sql", query=query))
    replies.append("The rows answer the question.\n" + call("answer", query=query))
    return replies, untrained


def _workspace(task: Task, kind: Kind) -> tuple[list[str], tuple[int, ...]]:
    path, given, fixed, test = _module(task)
    run_tests = call("shell", command=f"python3 {test}")
    # the test file holds the calls and their expected values; the runner's
    # failure lines name a test alone, so a fix made without reading it has
    # only the docstring to go on
    replies = [
        f"Let me read the module first.\n{call('read_file', path=path)}",
        f"Now the tests, to see what the function must return.\n{call('read_file', path=test)}",
        f"Let me run the tests to see which fail.\n{run_tests}",
    ]
    untrained: tuple[int, ...] = ()
    if kind == "repair":
        untrained = (len(replies),)  # the wrong edit
        first = task.metadata["first_attempt"]
        if not isinstance(first, str) or first in (given, fixed):
            raise _no_trace(task, "metadata.first_attempt: not a wrong version of the module "
                            "(a text other than the module as given and its reference)")  # fmt: skip
        # the wrong edit reads as the direct trace's edit: the context is the
        # one an episode has when its first edit was wrong
        replies += [
            "I will change the code to do what the docstring says.\n"
            + call("edit_file", path=path, **edit(given, first)),
            f"Let me run the tests again.\n{run_tests}",
            "Some tests still fail; let me read the code again and make it do exactly what the docstring says.\n"
            + call("edit_file", path=path, **edit(first, fixed)),
        ]
    elif kind == "refused":
        untrained = (len(replies),)  # the edit that is refused
        right = edit(given, fixed)
        replies += [
            "I will change the code to do what the docstring says.\n"
            + call("edit_file", path=path, old=_retyped(task), new=right["new"]),
            "The edit was refused: its old text must be copied from the file exactly, indentation included.\n"
            + call("edit_file", path=path, **right),
        ]
    else:
        replies.append(
            "I will change the code to do what the docstring says.\n"
            + call("edit_file", path=path, **edit(given, fixed))
        )
    replies += [f"Let me run the tests again.\n{run_tests}", "The tests pass.\n" + call("submit")]
    return replies, untrained


def _retyped(task: Task) -> str | None:
    """The direct edit's old text retyped with its indentation wrong: each
    line's lost or, where that is still in the module (a one-line old text
    is), each level a tab. None where neither is refused by `edit_file` (the
    text is in the module as given)."""
    _, given, fixed, _ = _module(task)
    lines = edit(given, fixed)["old"].splitlines(keepends=True)
    lost = "".join(line.lstrip(" \t") for line in lines)
    tabs = "".join(re.sub(r"^(?:    )+", lambda m: "\t" * (len(m.group()) // 4), line) for line in lines)
    return next((w for w in (lost, tabs) if w not in given), None)


def edit(before: str, after: str) -> dict[str, str]:
    """The `edit_file` arguments that turn `before` into `after`: the lines
    between their common first and last lines, widened a line at a time
    until the old text occurs in `before` once (the workspace tool refuses
    an ambiguous edit)."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    if head == len(a) == len(b):
        raise ValueError("no edit: the texts are the same")
    lo, hi = head, len(a) - tail
    while True:
        old = "".join(a[lo:hi])
        if old and before.count(old) == 1:
            return {
                "old": old,
                "new": "".join(a[lo:head]) + "".join(b[head : len(b) - tail]) + "".join(a[len(a) - tail : hi]),
            }
        if lo == 0 and hi == len(a):
            raise ValueError("no edit: the old text cannot be made to occur once")
        lo, hi = (lo - 1, hi) if lo > 0 else (lo, hi + 1)


def read_traces(path: Path) -> list[dict[str, Any]]:
    """The file's traces; a TaskError (a ValueError) naming every line that
    is not a trace with as many mask values (each 0 or 1) as token ids, some
    of them trained."""
    path = Path(path)
    errors, out = LineErrors(path), []
    for n, t in errors.objects():
        wrong = [
            f"{key}: missing or not a {kind.__name__}"
            for key, kind in (("task_id", str), ("tokenizer", str), ("tokens", list), ("loss_mask", list))
            if not isinstance(t.get(key), kind)
        ]
        if wrong:
            errors.add(n, "; ".join(wrong) + " (write it with sarl tasks traces)")
        elif not all(type(x) is int and x >= 0 for x in t["tokens"]):
            errors.add(n, "tokens: token ids, whole numbers from 0")
        elif (
            len(t["tokens"]) != len(t["loss_mask"])
            or not all(type(x) is int and x in (0, 1) for x in t["loss_mask"])
            or 1 not in t["loss_mask"]
        ):
            errors.add(n, "loss_mask: as many values as tokens, each 0 or 1, some of them 1")
        else:
            out.append(t)
    errors.raise_any()
    if not out:
        raise TaskError(f"{path}: no trace")
    return out
