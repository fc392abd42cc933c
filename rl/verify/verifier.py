"""Verification: independent checks of a solution, each its own score.

  tests       the pass rate over the individual test cases (statements of
              `check()` that call the candidate), measured from the best
              constant answer: (rate - floor) / (1 - floor), where floor is
              the best pass rate of None, True, False, 0, 1, -1, "", [], {}, ()
              (e.g. 3 of 7 cases for `return False` on a boolean task). Any
              constant, and the prompt alone, scores 0; a full solution 1
  static      the solution compiles, and pyflakes finds no error in it
  stability   share of test cases that neither crashed nor timed out
  security    1 unless the solution attempted a forbidden action (network,
              processes, signals, writes outside the work dir, reads of
              secrets), as its audit hook saw it. Best effort: the sandbox, not
              this check, is what stops such actions.
  efficiency  1 within a quarter of the time limit, 0.5 within it, 0 beyond
  final_state expected files present with the expected content (only for
              tasks that name expected files)

Python tasks (a function, or a workspace with its tests) are graded here;
SQL, Node.js and Harbor tasks in rl.verify.formats, through the same pool.

Each check is run after the episode in a fresh sandbox (from a warm pool,
reset) with pristine copies of the task's files; the tests never touch the
sandbox's filesystem (see rl.verify.runner). The reward aggregates the checks
with configured weights; gated checks (security by default) zero the reward
when they fail. Every score is recorded, and each verification is appended to
the audit log.

The default weights count only `tests`: time-based scores are not
deterministic, and shaping a coding reward with style scores invites
reward hacking. Change `verify.weights` to use the others.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rl.tasks.format import Task
from rl.verify.checks import aggregate, efficiency_score, final_state_score, static_score, tests_score
from rl.verify.config import CHECKS, VerifyConfig
from rl.verify.formats import verify_harbor, verify_node, verify_sql, verify_text
from rl.verify.inside import NODE_MARKER, NODE_RUNNER, RUNNER, SQL_MARKER, SQL_RUNNER, runner_result
from rl.verify.verdict import Verdict
from sandboxes.config import Limits, SandboxConfig

T = TypeVar("T")

LOST_RETRIES = 3
"""How many times a verification whose sandbox was dead before it began is run again on a fresh one."""
RUNTIME_PROBES = {"node": ["node", "--version"]}
"""A command that runs in the sandbox when a task's runtime is there
(`system` needs nothing beyond the resident's Python)."""


class Verifier:
    """Verifies solutions in sandboxes from a warm pool; thread-safe."""

    def __init__(
        self,
        cfg: VerifyConfig | None = None,
        sandbox: SandboxConfig | None = None,
        audit: str | os.PathLike[str] | None = None,
    ):
        from sandboxes.pool import WarmPool

        self.cfg = cfg or VerifyConfig()
        self.sandbox = sandbox or SandboxConfig()
        runner = str(Path(__file__).with_name("runner.py"))  # compiled once per sandbox, before any sample
        self.pool = WarmPool(self.sandbox, size=self.workers, preload=(runner,))
        self.audit = Path(audit) if audit else None
        self._audit_lock = threading.Lock()
        self._floor: dict[str, float] = {}  # task_id -> best pass rate of a constant answer
        self._runtimes: dict[str, str] = {}  # runtime -> "" or why the sandbox cannot run it
        self.lost = 0
        """Verifications run again because their sandbox was dead before they reached it (in_sandbox)."""
        from sandboxes import interpreter

        self._python, self._trees = interpreter(self.sandbox)

    def in_sandbox(self, use: Callable[[Any], T], clean: bool = False) -> T:
        """`use(sandbox)` on a sandbox of the pool, given back after (reset,
        unless `clean`: `use` reset it already). A sandbox that turns out
        dead before any request of `use` reached it (SandboxLost: nothing of
        the candidate ran) is replaced and `use` run again, at most
        LOST_RETRIES times, each counted in `lost`: such a death says
        nothing of the candidate and is never its verdict. Any other
        SandboxError, or a loss once `use` had sent a request (the
        candidate's code may be what killed it), closes the sandbox and is
        raised."""
        from sandboxes import SandboxError
        from sandboxes.base import SandboxLost

        for attempt in range(LOST_RETRIES + 1):
            sb = self.pool.take()
            before = getattr(sb, "sent", 0)
            try:
                out = use(sb)
            except SandboxLost:
                sb.close()
                if attempt == LOST_RETRIES or getattr(sb, "sent", 0) != before:
                    raise
                with self._audit_lock:
                    self.lost += 1
                continue
            except SandboxError:
                sb.close()
                raise
            self.pool.give(sb, clean=clean)
            return out
        raise AssertionError("unreachable")

    @property
    def workers(self) -> int:
        return self.cfg.parallel or os.cpu_count() or 1

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def verify(self, task: Task, completion: str, final_files: dict[str, str] | None = None) -> Verdict:
        """Verify `prompt + completion` against the task's tests. Every sample
        gets a verdict, whatever it contains: an error of the verifier itself
        is a verdict with reward 0 whose failure starts with "verifier error"."""
        t0 = time.monotonic()
        try:
            return self._verify(task, completion, final_files, t0)
        except Exception as e:  # noqa: BLE001 (one sample must never sink a batch)
            verdict = Verdict(
                task_id=task.task_id,
                reward=0.0,
                checks=dict.fromkeys(CHECKS),
                passed=False,
                failure=f"verifier error: {type(e).__name__}: {str(e)[:300]}",
                duration_s=round(time.monotonic() - t0, 4),
            )
            self._log(verdict)
            return verdict

    def _verify(self, task: Task, completion: str, final_files: dict[str, str] | None, t0: float) -> Verdict:
        if task.test_format == "sql":
            return verify_sql(self, task, completion, t0)
        if task.test_format == "node":
            return verify_node(self, task, completion, t0)
        if task.test_format == "harbor":
            return verify_harbor(self, task, completion, final_files, t0)
        if task.test_format == "text":
            return verify_text(self, task, completion, t0)
        if task.test_format == "workspace":
            # the final work dir is the answer; its tests/ are the task's again
            final_files = graded_workspace(task, final_files)
            static: float | None
            static, static_why, solution = None, "", ""
        else:
            solution = task.prompt + completion
            static, static_why = static_score(solution)
        run = self._run_tests(task, solution, constants=task.task_id not in self._floor, workspace=final_files)
        if "constant_rates" in run:
            floor = max(run["constant_rates"].values(), default=0.0)
            if task.test_format == "workspace":  # doing nothing is a floor too
                floor = max(floor, self._pristine_rate(task))
            # stored whole, once known: another thread verifying the same task reads it meanwhile
            self._floor[task.task_id] = floor
        cases = run.get("cases", [])
        n = len(cases)
        passed_cases = sum(c["ok"] for c in cases)
        floor = self.floor(task)
        unstable = run.get("crashes", 0) + run.get("timeouts", 0)
        limit = run.get("limit")
        checks: dict[str, float | None] = {
            "tests": tests_score(passed_cases, n, floor),
            "static": static,
            "stability": 0.0 if limit else (max(0.0, 1.0 - unstable / n) if n else 0.0),
            "security": 0.0 if run.get("events") else 1.0,
            "efficiency": efficiency_score(run.get("duration_s", 0.0), task.limits.wall_s, limit),
            "final_state": final_state_score(task, final_files),
        }
        failure = ""
        if run.get("error"):
            failure = run["error"]
        elif run.get("load_error"):
            failure = f"solution did not load: {run['load_error']}"
        elif limit:
            failure = f"limit hit: {limit}"
        elif n == 0:
            failure = "the tests have no case that calls the candidate"
        else:
            bad = next((c for c in cases if not c["ok"]), None)
            if bad:
                failure = f"test case at tests.py line {bad['line']}: {bad['why']}"
        if not failure and static == 0.0:
            failure = static_why
        passed = bool(n) and passed_cases == n and not limit
        return self.verdict(task, checks, passed, n, passed_cases, failure, t0, run.get("events", []))

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
    ) -> Verdict:
        """The Verdict of these check scores, its reward as configured,
        appended to the audit log."""
        verdict = Verdict(
            task_id=task.task_id,
            reward=aggregate(checks, self.cfg),
            checks=checks,
            passed=passed,
            cases=cases,
            cases_passed=cases_passed,
            failure=failure,
            events=events or [],
            duration_s=round(time.monotonic() - t0, 4),
        )
        self._log(verdict)
        return verdict

    def runtime_problem(self, runtime: str) -> str:
        """ "" when the sandbox can run a task of `runtime`, else why not
        (looked up once per runtime, inside a sandbox of the pool)."""
        if runtime not in self._runtimes:
            probe = RUNTIME_PROBES.get(runtime)
            why = ""
            if probe is not None:
                from sandboxes import SandboxError

                try:
                    r = self.in_sandbox(lambda sb: sb.exec(probe, limits=Limits(wall_s=10.0)))
                    if r.exit_code != 0:
                        why = f"runtime {runtime!r}: `{probe[0]}` does not run in the sandbox ({r.stderr[-200:]!r})"
                except (SandboxError, OSError) as e:
                    why = f"runtime {runtime!r}: `{probe[0]}` cannot be started in the sandbox: {e}"
            self._runtimes[runtime] = why
        return self._runtimes[runtime]

    def run_node(
        self, task: Task, solution: str, calls: list[Any], expected: list[Any], sandbox: Any = None, wall_s: float = 0.0
    ) -> dict[str, Any]:
        """The Node.js runner (rl/verify/node_runner.py) on `solution` in
        `sandbox` (the episode's, for its visible examples), or in a fresh
        one from the pool: its JSON result, with `limit` and `duration_s`."""
        params = {
            "solution": solution,
            "entry": task.entry_point,
            "calls": calls,
            "expected": expected,
            "call_s": task.limits.call_s,
        }
        limits = Limits(wall_s=wall_s or task.limits.wall_s, memory_mb=task.limits.memory_mb, cpu_s=task.limits.wall_s)
        return self._snippet(NODE_RUNNER, NODE_MARKER, params, limits, sandbox)

    def run_sql(self, params: dict[str, Any], limits: Limits, sandbox: Any = None) -> dict[str, Any]:
        """The SQL runner (rl/verify/sql_runner.py) in `sandbox`, or in a fresh
        one from the pool: its JSON result, with `limit` and `duration_s`."""
        return self._snippet(SQL_RUNNER, SQL_MARKER, params, limits, sandbox)

    def _snippet(
        self, code: str, marker: str, params: dict[str, Any], limits: Limits, sandbox: Any = None
    ) -> dict[str, Any]:
        """A runner snippet with PARAMS, and the JSON of its last line after
        `marker`. In the episode's own `sandbox`, a failure of the sandbox is
        raised (an infrastructure failure, retried); in one of the pool's, it
        is the result's error."""
        from sandboxes import SandboxError

        def run(sb: Any) -> Any:
            return sb.run_snippet(code, limits=limits, globals={"PARAMS": params}, cache=True, reset_after=own)

        own = sandbox is None
        if not own:
            r = run(sandbox)  # the episode's: a failure of its sandbox is raised (retried as an episode)
        else:
            try:
                r = self.in_sandbox(run, clean=True)
            except SandboxError as e:
                return {"error": f"sandbox failed: {e}"}
        out = r.stdout.decode(errors="replace").rstrip("\n")
        _, sep, last = out.rpartition("\n" + marker)
        result: dict[str, Any] = {"limit": r.limit} if r.limit else {}
        if sep and not r.limit:
            try:
                result = json.loads(last)
            except ValueError:
                result = {"error": "the runner's result did not parse"}
        elif not r.limit:
            result = {"error": "the runner ended without a result: " + r.stderr.decode(errors="replace")[-300:]}
        result["duration_s"] = r.duration_s
        return result

    def floor(self, task: Task) -> float:
        """The best pass rate of a constant answer, and for a workspace of
        its untouched files (cached per task)."""
        if task.task_id not in self._floor:  # measured along with any verification of the task
            workspace = task.files if task.test_format == "workspace" else None
            run = self._run_tests(task, task.prompt, constants=True, workspace=workspace)
            floor = max(run.get("constant_rates", {}).values(), default=0.0)
            if workspace is not None:
                floor = max(floor, self._pristine_rate(task))
            self._floor[task.task_id] = floor
        return self._floor[task.task_id]

    def _pristine_rate(self, task: Task) -> float:
        """The pass rate of a workspace task's files as given: a change that
        fixes nothing scores 0, not the share of cases the bug leaves alone.
        A run cut by a limit, a timeout or a sandbox error (a loaded machine)
        would understate it and let doing nothing score: such a run is
        measured again, the best of 3 kept, and with no run graded at all
        the verification fails (a verifier error, and no floor is kept)."""
        best, why = None, ""
        for _ in range(3):
            run = self._run_tests(task, "", workspace=task.files)
            cases = run.get("cases", [])
            if cases and not run.get("limit") and not run.get("error"):
                rate = sum(c["ok"] for c in cases) / len(cases)
                best = rate if best is None else max(best, rate)
                if not run.get("timeouts") and not run.get("crashes"):
                    return best
            why = run.get("error") or run.get("limit") or "cases timed out or crashed"
        if best is None:
            raise RuntimeError(f"the untouched work dir could not be graded: {why}")
        return best

    def verdict_of_checks(self, task: Task, checks: dict[str, Any]) -> Verdict:
        """A Verdict from an environment's own check scores (rl.agent.env):
        known check names, scores in [0, 1]; the reward as configured."""
        unknown = sorted(set(checks) - set(CHECKS))
        if unknown:
            raise ValueError(f"unknown check(s) {unknown}; checks are {list(CHECKS)}")
        scores: dict[str, float | None] = dict.fromkeys(CHECKS)
        for name, v in checks.items():
            if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= v <= 1.0):
                raise ValueError(f"check {name!r} scored {v!r}; a score is a number in [0, 1] or None")
            scores[name] = None if v is None else float(v)
        passed = scores.get("tests") == 1.0
        why = "" if passed else "the environment's checks did not all pass"
        return self.verdict(task, scores, passed, 0, 0, why, time.monotonic())

    def _run_tests(
        self, task: Task, solution: str, constants: bool = False, workspace: dict[str, str] | None = None
    ) -> dict[str, Any]:
        from sandboxes import SandboxError

        module = task.test_format == "workspace"
        params = {
            "python": self._python,
            "trusted_trees": self._trees,
            "entry_point": f"module:{task.entry_point}" if module else task.entry_point,
            "call_s": task.limits.call_s,
            "prompt": "" if module else task.prompt,
            "constants": constants,
        }
        limits = Limits(wall_s=task.limits.wall_s, memory_mb=task.limits.memory_mb, cpu_s=task.limits.wall_s)
        files: dict[str, bytes | str]
        if module:
            files = {f"/sandbox/{path}": content for path, content in (workspace or {}).items()}
        else:
            files = {f"/sandbox/{path}": content for path, content in task.files.items()}
            files["/sandbox/solution.py"] = solution
        try:  # files, run and reset in one round trip to the sandbox
            r = self.in_sandbox(
                lambda sb: sb.run_snippet(
                    RUNNER,  # the same code every time: compiled once by the agent
                    limits=limits,
                    stream=task.tests.encode(),
                    files=files,
                    reset_after=True,
                    globals={"PARAMS": params},
                    cache=True,
                ),
                clean=True,
            )
        except SandboxError as e:  # none could be started, or it died under the candidate: the verdict says so
            return {"error": f"sandbox failed: {e}"}
        if r.limit:
            return {"limit": r.limit, "error": f"limit hit: {r.limit}", "duration_s": r.duration_s}
        result = runner_result(r.stdout)
        if result is None:
            return {"error": "the test runner ended without a readable result", "duration_s": r.duration_s}
        result["duration_s"] = r.duration_s
        return result

    def _log(self, verdict: Verdict) -> None:
        if self.audit is None:
            return
        line = json.dumps({"at": time.time(), **verdict.to_json()}) + "\n"
        with self._audit_lock, open(self.audit, "a") as f:
            f.write(line)

    def verify_many(self, jobs: list[tuple[Task, str]], progress: Any = None) -> list[Verdict]:
        """Verify in parallel, one sandbox per worker; results in input order."""
        from concurrent.futures import ThreadPoolExecutor

        out: list[Verdict | None] = [None] * len(jobs)

        def one(i: int) -> None:
            out[i] = self.verify(*jobs[i])
            if progress is not None:
                progress.update()

        with ThreadPoolExecutor(self.workers) as ex:
            list(ex.map(one, range(len(jobs))))
        return [v for v in out if v is not None]


def graded_workspace(task: Task, final: dict[str, str] | None) -> dict[str, str]:
    """The work dir as it is graded: the episode's final files, with every
    file under `tests/` the task's own (edited ones put back, added ones
    dropped). Nothing else of the work dir is read by the grading process:
    the tests arrive over its stdin, and only the candidate's process
    imports from the work dir."""
    files = {p: c for p, c in (final or {}).items() if not _is_test(p)}
    files.update({p: c for p, c in task.files.items() if _is_test(p)})
    return files


def _is_test(path: str) -> bool:
    return path == "tests" or path.startswith("tests/")
