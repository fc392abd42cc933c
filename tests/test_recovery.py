"""Recovery without a human (rl.run.recovery), on the local executor with the
smoke role: real processes, real signals, no model. Task 0 watches; the
tests harm task 1 and touch nothing else (no `sarl resume`)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sarl, smoke_config, task_state, wait_for, write_config

RECOVERY = {"enabled": True, "check_s": 1, "beat_s": 0.5, "hung_s": 5}


def _start(workdir: Path, steps: int, step_s: float, smoke: Any = None, recovery: Any = None) -> Path:
    """The smoke run with recovery on; `smoke` and `recovery`: more keys of their sections."""
    body = smoke_config(
        workers=2, steps=steps, step_s=step_s, smoke=smoke or {}, recovery={**RECOVERY, **(recovery or {})}
    )
    sarl("submit", str(write_config(workdir, body)), "--cluster", "local", cwd=workdir)
    return workdir / "runs" / "t"


def _state(run: Path, task: int) -> dict[str, Any]:
    path = run / "checkpoints" / "smoke" / f"task-{task:06d}.json"
    return task_state(run, task) if path.exists() else {}


def _pid(run: Path, task: int) -> int:
    return int(json.loads((run / "heartbeats" / "smoke" / f"task-{task:06d}.json").read_text())["pid"])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _deaths(run: Path, task: int) -> list[dict[str, Any]]:
    path = run / "recovery" / "smoke" / f"task-{task:06d}.json"
    return json.loads(path.read_text())["deaths"] if path.exists() else []


@pytest.mark.slow  # 24 s alone: out of the fast tier
def test_a_sigkilled_task_is_resubmitted_by_the_watcher_and_finishes(workdir: Path) -> None:
    run = _start(workdir, steps=40, step_s=0.5)
    try:
        wait_for(lambda: _state(run, 1).get("step", 0) >= 3, 60, "task 1's third step")
        victim = _pid(run, 1)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: len(_state(run, 1).get("starts", [])) == 2, 60, "task 1 to start again")
        restarted = _state(run, 1)["starts"][1]
        assert restarted["at"] - killed_at < 30  # bounded: check_s 1, plus a process start
        assert int(restarted["from"].split("/")[0]) >= 3  # from its committed step, not from 0
        wait_for(lambda: _state(run, 1).get("done") and _state(run, 0).get("done"), 120, "both tasks")
        deaths = _deaths(run, 1)
        assert len(deaths) == 1 and deaths[0]["reason"].startswith(("DIED", "FAILED")), deaths
        assert len(_state(run, 0)["starts"]) == 1  # the watcher itself was not touched
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)


@pytest.mark.slow  # 35 s alone: out of the fast tier
def test_a_stopped_task_is_cancelled_as_hung_and_replaced(workdir: Path) -> None:
    run = _start(workdir, steps=40, step_s=0.5)
    try:
        wait_for(lambda: _state(run, 1).get("step", 0) >= 2, 60, "task 1's second step")
        victim = _pid(run, 1)
        os.kill(victim, signal.SIGSTOP)  # alive to the scheduler, silent: hung
        wait_for(lambda: len(_state(run, 1).get("starts", [])) == 2, 90, "task 1 to be replaced")
        assert not _alive(victim)  # the stopped process was killed, not left behind
        wait_for(lambda: _state(run, 1).get("done"), 120, "task 1 to finish")
        assert len(_deaths(run, 1)) == 1
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)


@pytest.mark.slow  # 46 s alone: out of the fast tier
def test_a_task_that_beats_but_makes_no_progress_is_cancelled_as_stalled_and_replaced(workdir: Path) -> None:
    """Task 1's loop deadlocks half-way at its first start (smoke.stall_tasks)
    while its beat thread goes on: the heartbeat stays fresh, its progress
    stamp does not. The watcher cancels it as stalled, with that reason, and
    the replacement finishes from the committed step."""
    # task 0 (the watcher) runs 30 s: past task 1's stall at step 50, stall_s, and the
    # local cancel's 5 s SIGTERM grace
    run = _start(workdir, steps=100, step_s=0.3, smoke={"stall_tasks": [1]}, recovery={"stall_s": 5})
    try:
        wait_for(lambda: _state(run, 1).get("step", 0) >= 50, 60, "task 1 to reach its stall")
        victim = _pid(run, 1)
        wait_for(lambda: len(_state(run, 1).get("starts", [])) == 2, 60, "task 1 to be replaced")
        assert not _alive(victim)  # the stalled process was cancelled, not left running beside its successor
        assert _state(run, 1)["starts"][1]["from"].startswith("50/")
        wait_for(lambda: _state(run, 1).get("done"), 60, "task 1 to finish")
        deaths = _deaths(run, 1)
        assert len(deaths) == 1 and deaths[0]["reason"].startswith("stalled: no progress for"), deaths
        assert deaths[0]["reason"].endswith("while its heartbeat is fresh")  # alive, not advancing
        assert len(_state(run, 0)["starts"]) == 1  # task 0 made progress all along: never touched
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)


@pytest.mark.slow  # 64 s alone: out of the fast tier
def test_a_crash_loop_is_given_up_after_max_restarts_with_the_reason_in_status(workdir: Path) -> None:
    """Task 1 raises half-way at every start (smoke.fail_tasks). With
    max_restarts = 2 it is started 3 times, then left down; `sarl status`
    says why. `sarl resume` (a person) clears the count and starts it again."""
    run = _start(workdir, steps=400, step_s=0.2, smoke={"fail_tasks": [1]}, recovery={"max_restarts": 2})
    try:
        wait_for(lambda: "not restarted" in _status_reason(run, 1), 150, "task 1 to be given up")
        assert len(_state(run, 1)["starts"]) == 3 and len(_deaths(run, 1)) == 3
        reason = _status_reason(run, 1)
        assert "crash loop: died 3 times" in reason and "max_restarts = 2" in reason
        assert "smoke task 1 fails" in reason  # the last failure's own words
        time.sleep(3)  # several more looks of the watcher: still down
        assert len(_state(run, 1)["starts"]) == 3
        sarl("resume", str(run), cwd=workdir)
        assert _deaths(run, 1) == []
        wait_for(lambda: len(_state(run, 1).get("starts", [])) == 4, 60, "the resumed task 1")
        # a person's `sarl cancel` sticks: a recovery round after it (as a watcher whose job
        # outlives the scancel would run) resubmits nothing
        sarl("cancel", str(run), cwd=workdir)
        records = sorted((run / "submissions" / "smoke").glob("*.json"))
        from rl.run.recovery import recover
        from rl.run.rundir import RunDir

        assert recover(RunDir(run)) == []
        assert sorted((run / "submissions" / "smoke").glob("*.json")) == records
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)


def _status_reason(run: Path, task: int) -> str:
    out = sarl("status", str(run), "--json", cwd=run.parent, check=False)
    if out.returncode not in (0, 1) or not out.stdout.strip():
        return ""
    return str(json.loads(out.stdout)["roles"]["smoke"]["detail"][task].get("reason", ""))
