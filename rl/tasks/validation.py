"""Task quality: validation and deduplication.

* `validate()` runs every task's reference (several times: results must be
  identical, else the task is flaky and quarantined), an empty and several
  trivial solutions (none may pass), and flags tests that have no case
  calling the candidate and references that exceed their limits.
* `duplicates()` finds exact duplicates (prompt and tests equal once comments,
  docstrings and whitespace are normalised away) and near-duplicates
  (MinHash over token 5-shingles; estimated Jaccard >= `threshold`).

The pool of tasks that a run draws from (statistics, difficulty, dynamic
sampling) is rl.tasks.pool.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import xxhash

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
        refs = [verifier.verify(task, task.reference) for _ in range(repeats)]
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
            for trivial in TRIVIAL:
                v = verifier.verify(task, trivial)
                if v.passed:
                    rep.problems.append(f"a trivial solution passes every test: {trivial.strip()!r}")
                    break
        if task.task_id in dups:
            rep.problems.append(dups[task.task_id])
        rep.ok = not rep.problems
        if progress is not None:
            progress()
        return rep

    with ThreadPoolExecutor(verifier.workers) as ex:
        return list(ex.map(one, tasks))


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


# --------------------------------------------------------------- duplicates


def normalise(code: str) -> str:
    """Code without comments, docstrings and layout: what makes two tasks the same."""
    try:
        tree = ast.parse(code)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if not isinstance(body, list) or not body:
                continue
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                body[0] = ast.Pass()  # a docstring
        code = ast.unparse(tree)
    except SyntaxError:
        pass
    return re.sub(r"\s+", " ", code).strip()


def _tokens(code: str) -> list[str]:
    try:
        return [
            t.string
            for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        ]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code.split()


_RNG = np.random.default_rng(20241130)
_A = _RNG.integers(1, 2**63, 128, dtype=np.uint64) | np.uint64(1)  # odd multipliers
_B = _RNG.integers(0, 2**63, 128, dtype=np.uint64)


def minhash(text: str, k: int = 5) -> np.ndarray:
    """128 MinHash values of the token k-shingles (one xxh3 per shingle, then
    128 multiply-add hashes mod 2^64, vectorised)."""
    toks = _tokens(text)
    shingles = {" ".join(toks[i : i + k]) for i in range(max(1, len(toks) - k + 1))}
    x = np.fromiter((xxhash.xxh3_64_intdigest(s.encode()) for s in shingles), dtype=np.uint64, count=len(shingles))
    with np.errstate(over="ignore"):
        return (_A[:, None] * x[None, :] + _B[:, None]).min(axis=1)


def duplicates(tasks: list[Task], threshold: float = 0.8) -> dict[str, str]:
    """task_id -> why it duplicates an earlier task (the first of each kind is kept)."""
    out: dict[str, str] = {}
    exact: dict[str, str] = {}
    sigs: list[tuple[str, np.ndarray]] = []
    for t in tasks:
        key = normalise(t.prompt) + "\0" + normalise(t.tests)
        if key in exact:
            out[t.task_id] = f"duplicate of {exact[key]}"
            continue
        exact[key] = t.task_id
        sig = minhash(t.prompt + "\n" + t.tests)
        for other, osig in sigs:
            j = float(np.mean(sig == osig))
            if j >= threshold:
                out[t.task_id] = f"near-duplicate of {other} (estimated Jaccard {j:.2f})"
                break
        else:
            sigs.append((t.task_id, sig))
    return out


def report_json(reports: list[TaskReport]) -> dict[str, Any]:
    bad = [r for r in reports if not r.ok]
    return {
        "tasks": len(reports),
        "ok": len(reports) - len(bad),
        "flagged": len(bad),
        "reports": [asdict(r) for r in reports],
    }
