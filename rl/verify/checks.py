"""The checks of a verification, one function each, and their aggregation
into a reward (the list of checks and what each measures: rl.verify.verifier).
A check that does not apply to a task scores None."""

from __future__ import annotations

from rl.tasks.format import Task
from rl.verify.config import VerifyConfig

MAX_STATIC_BYTES = 64 * 1024
"""Largest solution the host-side static check reads: pyflakes costs about
2.3 s per MB, and a sample must not buy verifier time with its length."""


def tests_score(passed: int, cases: int, floor: float) -> float:
    """The pass rate measured from `floor` (the best pass rate of an answer
    that does nothing): (rate - floor) / (1 - floor), at least 0. With a
    floor of 1 (every case passes for a constant) only a full pass scores;
    with no case, 0."""
    if not cases:
        return 0.0
    rate = passed / cases
    return max(0.0, (rate - floor) / (1.0 - floor)) if floor < 1.0 else float(rate == 1.0)


def static_score(source: str) -> tuple[float, str]:
    """1.0 when the source compiles and pyflakes reports nothing; less per
    message; 0 for a source that does not compile, is too deep for the
    compiler, or is longer than MAX_STATIC_BYTES."""
    size = len(source.encode(errors="replace"))
    if size > MAX_STATIC_BYTES:
        return 0.0, f"static: the solution is {size} bytes, more than the {MAX_STATIC_BYTES} checked"
    try:
        compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as e:
        return 0.0, f"syntax: {e}"
    except (RecursionError, MemoryError) as e:
        return 0.0, f"syntax: too deeply nested to compile ({type(e).__name__})"
    try:
        from pyflakes.api import check as flakes_check
        from pyflakes.reporter import Reporter
    except ImportError:
        return 1.0, ""
    import io

    out, err = io.StringIO(), io.StringIO()
    try:
        n = flakes_check(source, "solution.py", Reporter(out, err))
    except (RecursionError, MemoryError) as e:
        return 0.0, f"static: too deeply nested to check ({type(e).__name__})"
    return max(0.0, 1.0 - 0.25 * n), out.getvalue().strip().splitlines()[0] if n else ""


def aggregate(checks: dict[str, float | None], cfg: VerifyConfig) -> float:
    for gate in cfg.gates:
        if checks.get(gate) == 0.0:
            return 0.0
    num = den = 0.0
    for name, w in cfg.weights.items():
        score = checks.get(name)
        if score is not None and w > 0:
            num += w * score
            den += w
    return round(num / den, 6) if den else 0.0


def efficiency_score(duration: float, wall: float, limit: str | None) -> float:
    if limit:
        return 0.0
    return 1.0 if duration <= wall / 4 else (0.5 if duration <= wall else 0.0)


def final_state_score(task: Task, files: dict[str, str] | None) -> float | None:
    if not task.expected_files:
        return None
    files = files or {}
    hits = sum(files.get(path) == content for path, content in task.expected_files.items())
    return hits / len(task.expected_files)
