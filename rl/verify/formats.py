"""Verification of the task formats that are not Python test cases: SQL
answers, JavaScript functions (Node.js) and Harbor task directories. Each
grades in a fresh sandbox of the verifier's pool and returns its Verdict
through `Verifier.verdict` (reward as configured, audit log).

  sql      the answer query's rows against the reference query's, on a
           fresh build of the task's database (rl/verify/sql_runner.py)
  node     the share of calls answered with the expected value, measured
           from the best constant answer (rl/verify/node_runner.py)
  harbor   `tests/test.sh` run on the final work dir, and the reward file
           it wrote (rl.tasks.harbor)
  text     the answer's LCS ratio to the expected text (partial credit;
           computed here: the answer is text, nothing of it runs)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from rl.tasks.format import Task
from rl.verify.checks import efficiency_score, tests_score
from rl.verify.config import CHECKS
from rl.verify.verdict import Verdict
from sandboxes.config import Limits

T = TypeVar("T")


class VerifierApi(Protocol):
    """What these graders use of rl.verify.verifier.Verifier, which calls
    them: its pool, its runners, and the one way a Verdict is made."""

    def in_sandbox(self, use: Callable[[Any], T], clean: bool = False) -> T: ...

    def run_node(
        self, task: Task, solution: str, calls: list[Any], expected: list[Any], sandbox: Any = None, wall_s: float = 0.0
    ) -> dict[str, Any]: ...

    def run_sql(self, params: dict[str, Any], limits: Limits, sandbox: Any = None) -> dict[str, Any]: ...

    def verdict(
        self,
        task: Task,
        checks: dict[str, float | None],
        passed: bool,
        cases: int,
        cases_passed: int,
        failure: str,
        t0: float,
        events: list[str] | None = None,
    ) -> Verdict: ...


SQL_SCRIPT = "data.sql"
"""The file of an SQL task that builds its database."""
CONSTANTS: list[Any] = [None, True, False, 0, 1, -1, "", [], {}]
"""Constant answers whose pass rate is a JavaScript task's floor."""


def node_spec(task: Task) -> dict[str, Any]:
    """A JavaScript task's hidden tests: the argument lists of each call, the
    expected values, and how many of the first calls are visible examples."""
    try:
        spec = json.loads(task.tests)
    except ValueError:
        spec = None
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("calls"), list)
        or not isinstance(spec.get("expected"), list)
        or len(spec["calls"]) != len(spec["expected"])
        or not all(isinstance(c, list) for c in spec["calls"])
    ):
        raise ValueError('tests: a node task\'s tests are {"calls": [[args...], ...], "expected": [...], "visible": N}')
    return {"calls": spec["calls"], "expected": spec["expected"], "visible": int(spec.get("visible", 0))}


def sql_spec(task: Task) -> dict[str, Any]:
    """An SQL task's hidden check: its reference query and whether the order of rows counts."""
    try:
        spec = json.loads(task.tests)
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or not isinstance(spec.get("reference"), str):
        raise ValueError('tests: an sql task\'s tests are {"reference": SQL, "ordered": true|false}')
    return {"reference": spec["reference"], "ordered": bool(spec.get("ordered", False))}


def verify_sql(v: VerifierApi, task: Task, query: str, t0: float) -> Verdict:
    """An answer query against the reference query, on a fresh build of
    the task's database in a fresh sandbox: the same rows (in the same
    order where the question asks for one) pass."""
    spec = sql_spec(task)
    params = {"op": "grade", "script": task.files.get(SQL_SCRIPT, ""), "answer": query, **spec}
    got = v.run_sql(params, Limits(wall_s=task.limits.wall_s, memory_mb=task.limits.memory_mb))
    ok = bool(got.get("ok"))
    limit = got.get("limit")
    checks: dict[str, float | None] = dict.fromkeys(CHECKS)
    duration = float(got.get("duration_s", 0.0))
    checks.update(
        tests=1.0 if ok else 0.0,
        stability=0.0 if (limit or "error" in got) else 1.0,
        security=1.0,
        efficiency=efficiency_score(duration, task.limits.wall_s, limit),
    )
    failure = "" if ok else (got.get("why") or got.get("error") or f"limit hit: {limit}")
    return v.verdict(task, checks, ok, 1, int(ok), failure, t0)


def verify_node(v: VerifierApi, task: Task, solution: str, t0: float) -> Verdict:
    """A JavaScript function against the task's calls, in a fresh sandbox:
    the share of calls answered with the expected value, measured from the
    best constant answer."""
    from rl.verify.node_runner import same

    spec = node_spec(task)
    run = v.run_node(task, solution, spec["calls"], spec["expected"])
    cases = run.get("cases", [])
    n, passed = len(cases), sum(c["ok"] for c in cases)
    floor = max((sum(same(c, want) for want in spec["expected"]) / max(1, n) for c in CONSTANTS), default=0.0)
    limit = run.get("limit")
    checks: dict[str, float | None] = dict.fromkeys(CHECKS)
    unstable = sum(1 for c in cases if c.get("crash") or c["why"] == "timeout")
    checks.update(
        tests=tests_score(passed, n, floor),
        stability=0.0 if limit else (max(0.0, 1.0 - unstable / n) if n else 0.0),
        security=1.0,
        efficiency=efficiency_score(float(run.get("duration_s", 0.0)), task.limits.wall_s, limit),
    )
    bad = next((i for i, c in enumerate(cases) if not c["ok"]), None)
    failure = (
        run.get("error")
        or (f"solution did not load: {run['load_error']}" if run.get("load_error") else "")
        or (f"limit hit: {limit}" if limit else "")
        or ("" if bad is None else f"test call {bad + 1}: {cases[bad]['why']}")
    )
    return v.verdict(task, checks, bool(n) and passed == n and not limit, n, passed, failure, t0)


TEXT_CHARS = 4096
"""Characters of a text answer that are graded (the rest counts as wrong):
SequenceMatcher is quadratic in the worst case."""


def verify_text(v: VerifierApi, task: Task, answer: str, t0: float) -> Verdict:
    """A text answer against the expected text: the LCS ratio (difflib's
    SequenceMatcher ratio) is the tests score; only the exact text passes."""
    from difflib import SequenceMatcher

    from rl.tasks.texts import expected_text

    want = expected_text(task)
    got = answer.strip()
    ratio = SequenceMatcher(None, got[:TEXT_CHARS], want, autojunk=False).ratio() if got else 0.0
    if len(got) > TEXT_CHARS:
        ratio *= TEXT_CHARS / len(got)
    passed = got == want
    checks: dict[str, float | None] = dict.fromkeys(CHECKS)
    checks.update(tests=ratio, stability=1.0, security=1.0)
    failure = (
        ""
        if passed
        else ("no answer" if not got else f"the answer differs from the expected text (LCS ratio {ratio:.2f})")
    )
    return v.verdict(task, checks, passed, 1, int(passed), failure, t0)


def verify_harbor(v: VerifierApi, task: Task, script: str, final: dict[str, str] | None, t0: float) -> Verdict:
    """A Harbor task (rl.tasks.harbor): the final work dir in a fresh
    sandbox, the task's tests beside it, `tests/test.sh` run, and the
    reward file it wrote read. Without final files (validation), the work
    dir is the task's and `script` (the oracle, solve.sh) runs in it first."""
    from rl.tasks.harbor import LOGS, TESTS, harbor_reward
    from sandboxes import SandboxError

    tests = json.loads(task.tests)
    files: dict[str, bytes | str] = {f"/sandbox/{p}": c for p, c in (final or task.files).items()}
    files.update({f"{TESTS}/{p}": c for p, c in tests.items()})
    if final is None and script:
        files["/tmp/harbor/solve.sh"] = script
    limits = Limits(wall_s=task.limits.wall_s, cpu_s=task.limits.wall_s, memory_mb=task.limits.memory_mb)

    def grade(sb: Any) -> tuple[float | None, str, str | None, float]:
        sb.run_snippet(f"import os\nos.makedirs({LOGS!r}, exist_ok=True)\n", files=files)
        if final is None and script:
            sb.exec(["bash", "/tmp/harbor/solve.sh"], limits=limits, cwd="/sandbox")
        r = sb.exec(["bash", f"{TESTS}/test.sh"], limits=limits, cwd="/sandbox")
        for name in ("reward.txt", "reward.json"):
            got = sb.exec(["cat", f"{LOGS}/{name}"], limits=Limits(wall_s=5.0))
            if got.exit_code == 0:
                reward = harbor_reward(got.stdout.decode(errors="replace"), name)
                return reward, "" if reward is not None else f"{name} holds no reward", r.limit, r.duration_s
        tail = (r.stdout + r.stderr).decode(errors="replace")[-300:]
        why = f"test.sh wrote no reward file (exit {r.exit_code}{', ' + r.limit if r.limit else ''}): {tail}"
        return None, why, r.limit, r.duration_s

    try:  # given back reset: nothing of this work dir reaches the next verification
        reward, why, limit, duration = v.in_sandbox(grade)
    except SandboxError as e:
        return _harbor_verdict(v, task, None, f"verifier error: sandbox failed: {e}", None, t0, 0.0)
    return _harbor_verdict(v, task, reward, why, limit, t0, duration)


def _harbor_verdict(
    v: VerifierApi, task: Task, reward: float | None, why: str, limit: str | None, t0: float, duration: float
) -> Verdict:
    checks: dict[str, float | None] = dict.fromkeys(CHECKS)
    checks.update(
        tests=reward or 0.0,
        stability=0.0 if (limit or reward is None) else 1.0,
        security=1.0,
        efficiency=efficiency_score(duration, task.limits.wall_s, limit),
    )
    passed = reward is not None and reward >= 1.0
    return v.verdict(
        task, checks, passed, 1, int(passed), "" if passed else (why or f"test.sh gave reward {reward}"), t0
    )
