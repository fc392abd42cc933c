"""Task validation: is each task fit to train on?

`validate()` runs every task's reference (several times: results must be
identical, else the task is flaky and quarantined), an empty and several
trivial solutions (none may pass), and flags tests that have no case
calling the candidate, references that exceed their limits, and duplicates
(rl.tasks.dedup).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rl.tasks.dedup import duplicates
from rl.tasks.format import Task
from rl.verify.verifier import Verifier

TRIVIAL = (
    "    pass\n",
    "    return None\n",
    "    return 0\n",
    "    return ''\n",
    "    return []\n",
    "    return True\n",
    "    return False\n",
)


TRIVIAL_SQL = ("", "SELECT 1", "SELECT 0", "SELECT NULL", "SELECT 1 WHERE 0")
"""Answers to an SQL question that know nothing of the database."""


@dataclass
class TaskReport:
    task_id: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    cases: int = 0
    reference_s: float = 0.0


def validate(
    tasks: list[Task], verifier: Verifier, repeats: int = 3, progress: Callable[[], None] | None = None
) -> list[TaskReport]:
    """One report per task, in order; `ok` tasks have no problem."""
    from concurrent.futures import ThreadPoolExecutor

    dups = duplicates(tasks)

    def one(task: Task) -> TaskReport:
        rep = TaskReport(task.task_id, ok=True)
        missing = verifier.runtime_problem(task.runtime)
        if missing:  # the sandbox cannot run the task at all
            rep.problems.append(missing)
            rep.ok = False
            return rep
        try:
            reference, trivials = answers(task)
        except ValueError as e:
            rep.problems.append(str(e))
            rep.ok = False
            return rep
        refs = [verifier.verify(task, *reference) for _ in range(repeats)]
        first = refs[0]
        rep.cases = first.cases
        rep.reference_s = round(sum(r.duration_s for r in refs) / len(refs), 4)
        lines = assertless_cases(task)
        if first.failure.startswith("limit hit"):
            rep.problems.append(f"reference exceeds the limits ({first.failure})")
        elif first.cases == 0:
            rep.problems.append("tests assert nothing: no test case calls the candidate")
        elif lines:
            rep.problems.append(f"tests assert nothing at tests.py line(s) {', '.join(map(str, lines))}")
        elif not first.passed:
            rep.problems.append(f"reference fails: {first.failure}")
        if any((r.checks, r.passed, r.failure) != (first.checks, first.passed, first.failure) for r in refs[1:]) or any(
            r.checks["tests"] != first.checks["tests"] for r in refs
        ):
            rep.problems.append(f"flaky: {repeats} runs of the reference disagree (quarantined)")
        if first.cases:
            for name, trivial in trivials:
                v = verifier.verify(task, *trivial)
                if v.passed:
                    rep.problems.append(f"a trivial solution passes every test: {name}")
                    break
        if task.task_id in dups:
            rep.problems.append(dups[task.task_id])
        rep.ok = not rep.problems
        if progress is not None:
            progress()
        return rep

    with ThreadPoolExecutor(verifier.workers) as ex:
        return list(ex.map(one, tasks))


Answer = tuple[str, dict[str, str] | None]
"""What the verifier is given: the completion, and the final files (a workspace)."""


def answers(task: Task) -> tuple[Answer, list[tuple[str, Answer]]]:
    """The reference as an answer, and the trivial answers that must fail.
    A workspace's reference is a whole-file patch, {path: new content}; its
    trivial answers are the files untouched and the patched files emptied."""
    if task.test_format == "sql":
        return (task.reference, None), [(repr(q), (q, None)) for q in TRIVIAL_SQL]
    if task.test_format == "text":
        text = task.prompt.rpartition("Text: ")[2]
        return (task.reference, None), [("no answer", ("", None)), ("the text unchanged", (text, None))]
    if task.test_format == "harbor":
        if not task.reference.strip():
            raise ValueError("reference: the Harbor task has no solution/solve.sh to validate it with")
        return (task.reference, None), [("the files untouched", ("", dict(task.files)))]
    if task.test_format == "node":
        from rl.tasks.node import TRIVIAL_JS, stub

        return (task.reference, None), [(repr(b or "{}"), (stub(task, b), None)) for b in TRIVIAL_JS]
    if task.test_format != "workspace":
        return (task.reference, None), [(repr(t.strip()), (t, None)) for t in TRIVIAL]
    try:
        patch = json.loads(task.reference)
    except ValueError:
        patch = None
    if not isinstance(patch, dict) or not patch or not all(isinstance(v, str) for v in patch.values()):
        raise ValueError("reference: a workspace task's reference is a JSON object {path: new content}")
    if any(p.startswith("tests/") or p.startswith("/") or ".." in p.split("/") for p in patch):
        raise ValueError("reference: a patch may change the work dir's code, not tests/ or a path outside it")
    emptied = {**task.files, **dict.fromkeys(patch, "")}
    return ("", {**task.files, **patch}), [
        ("the files untouched", ("", dict(task.files))),
        ("the fix's files emptied", ("", emptied)),
    ]


def assertless_cases(task: Task) -> list[int]:
    """Lines of check() statements that call the candidate but assert nothing."""
    try:
        tree = ast.parse(task.tests)
    except SyntaxError:
        return []
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None or not check.args.args:
        return []
    param = check.args.args[0].arg
    out = []
    for stmt in check.body:
        calls = any(isinstance(n, ast.Name) and n.id == param for n in ast.walk(stmt))
        asserts = any(isinstance(n, ast.Assert) for n in ast.walk(stmt))
        if calls and not asserts:
            out.append(stmt.lineno)
    return out


def report_json(reports: list[TaskReport]) -> dict[str, Any]:
    bad = [r for r in reports if not r.ok]
    return {
        "tasks": len(reports),
        "ok": len(reports) - len(bad),
        "flagged": len(bad),
        "reports": [asdict(r) for r in reports],
    }
