"""The same roles through the local executor: detached processes on this machine."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from conftest import sarl, smoke_config, status, task_state, wait_for, write_config

pytestmark = pytest.mark.slow


def _submit(workdir: Path, body: str) -> Path:
    cfg = write_config(workdir, body)
    out = sarl("submit", str(cfg), "--cluster", "local", cwd=workdir)
    assert out.stdout.startswith("Submitted smoke job local pid")
    return workdir / "runs" / "t"


def _all_done(run: Path) -> bool:
    return status(run)["roles"]["smoke"]["counts"]["done"] == status(run)["roles"]["smoke"]["tasks"]


def test_smoke_array_completes_locally(workdir: Path) -> None:
    run = _submit(workdir, smoke_config(workers=3, steps=4, step_s=1.0))
    returned = time.time()  # each task needs 4 s of steps after it starts: submit must return first
    # `sarl logs -f` follows the tasks as they start and write, and ends once every one has ended
    followed = sarl("logs", str(run), "-f", "-n", "0", cwd=workdir, timeout=300)
    assert _all_done(run)
    for t in range(3):
        assert followed.stdout.count(f"sarl: start smoke/{t} #1 (job ") == 2, followed.stdout  # stdout and stderr
        assert re.search(rf"^==> smoke/{t} #1 \(job \d+ on .*\) (stderr|stdout): ", followed.stdout, re.M)
    for t in range(3):
        s = task_state(run, t)
        assert s["done"] and s["step"] == 4 and len(s["starts"]) == 1
        assert s["result"] == {"task": t, "steps": 4, "starts": 1}
        assert s["updated_at"] > returned  # the task ended after submit returned


def test_local_jobs_outlive_the_submitting_session(workdir: Path) -> None:
    run = _submit(workdir, smoke_config(workers=1, steps=30, step_s=0.2))
    pid = int(status(run)["roles"]["smoke"]["detail"][0]["job_id"].split()[1])
    assert os.getsid(pid) == pid != os.getsid(0)  # leads a session of its own
    sarl("cancel", str(run), cwd=workdir)


def test_local_cancel_then_resume_continues_from_state(workdir: Path) -> None:
    """Both tasks' first starts stall half-way (smoke.stall_tasks), so they
    are still running when the cancel lands however slow the machine is; a
    later start runs normally."""
    body = smoke_config(workers=2, steps=20, step_s=0.1, smoke={"stall_tasks": [0, 1]})
    run = _submit(workdir, body)
    wait_for(
        lambda: all(
            os.path.exists(run / f"checkpoints/smoke/task-00000{t}.json") and task_state(run, t)["step"] >= 10
            for t in range(2)
        ),
        120,
        "10 steps",
    )
    out = sarl("cancel", str(run), cwd=workdir)
    assert out.stdout.count("cancelled smoke") == 1
    st = status(run)["roles"]["smoke"]
    assert [t["status"] for t in st["detail"]] == ["CANCELLED", "CANCELLED"]
    assert [t["reason"] for t in st["detail"]] == ["CANCELLED by sarl cancel"] * 2  # no log line appended
    before = [task_state(run, t)["step"] for t in range(2)]
    assert before == [10, 10]  # where each first start stalled
    out = sarl("resume", str(run), cwd=workdir)
    assert "Submitted smoke job" in out.stdout and "(2 tasks)" in out.stdout
    wait_for(lambda: _all_done(run), 60, "resumed tasks to finish")
    for t in range(2):
        s = task_state(run, t)
        assert s["step"] == 20
        assert [x["from"] for x in s["starts"]] == ["0/20 steps", "10/20 steps"]
    # `sarl logs`: the two attempts ran as two jobs, each with its own files, each part under its attempt
    logs = sarl("logs", str(run), "smoke/1", "-n", "0", cwd=workdir).stdout
    parts = re.findall(r"^==> smoke/1 #(\d) \(job (\d+) on .*, from (.*)\) (stderr|stdout): (\S+) <==$", logs, re.M)
    assert [(n, s) for n, _, _, s, _ in parts] == [("1", "stderr"), ("1", "stdout"), ("2", "stderr"), ("2", "stdout")]
    assert parts[0][2] == "0/20 steps" and parts[2][2] == "10/20 steps", logs
    assert parts[0][1] != parts[2][1] and len({f for *_, f in parts}) == 4  # two jobs, four files


def test_local_array_parallelism_is_enforced(workdir: Path) -> None:
    body = smoke_config(workers=4, steps=3, step_s=1.0, smoke={"job": {"array_parallelism": 2}})
    run = _submit(workdir, body)
    wait_for(lambda: _all_done(run), 60, "4 tasks to finish")
    spans = [(task_state(run, t)["starts"][0]["at"], task_state(run, t)["updated_at"]) for t in range(4)]
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert most == 2


def test_local_failure_is_reported_with_its_exception(workdir: Path) -> None:
    run = _submit(workdir, smoke_config(workers=2, steps=4, step_s=0.1, smoke={"fail_tasks": [1]}))
    wait_for(lambda: status(run)["roles"]["smoke"]["counts"]["failed"] == 1, 60, "task 1 to fail")
    t1 = status(run)["roles"]["smoke"]["detail"][1]
    assert t1["status"] == "FAILED"
    assert "RuntimeError: smoke task 1 fails at step 2" in t1["reason"]
    text = sarl("status", str(run), cwd=workdir).stdout
    assert "why: FAILED; RuntimeError: smoke task 1 fails at step 2" in text
    # clearing the failure is a mid-run-safe change; the task resumes at step 2
    wait_for(lambda: _all_done_but(run, 1), 60, "task 0")
    sarl("resume", str(run), "--set", "smoke.fail_tasks=[]", cwd=workdir)
    wait_for(lambda: _all_done(run), 60, "task 1 to finish after resume")
    assert [x["from"] for x in task_state(run, 1)["starts"]] == ["0/4 steps", "2/4 steps"]


def _all_done_but(run: Path, task: int) -> bool:
    detail = status(run)["roles"]["smoke"]["detail"]
    return all(t["status"] == "DONE" for t in detail if t["task"] != task)
