"""Roles on the real local Slurm (scripts/slurm-up.sh): arrays, status,
preemption by requeue, scancel and resume."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import sarl, smoke_config, status, task_state, wait_for, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _submit(workdir: Path, body: str, *args: str) -> tuple[Path, str]:
    cfg = write_config(workdir, body)
    out = sarl("submit", str(cfg), "--cluster", "slurm", *args, cwd=workdir)
    job = out.stdout.split()[3]
    assert out.stdout.startswith(f"Submitted smoke job {job} ")
    return workdir / "runs" / "t", job


def _sacct(job: str) -> list[str]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--duplicates", "-j", job, "-o", "JobID,State"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def _squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_array_of_8_completes_and_status_tells_the_truth(workdir: Path, slurm: None) -> None:
    # 8 s a task: the first 4 must all be running, with heartbeats, while the other 4 still wait
    # (on a loaded machine the first tasks' starts are seconds apart)
    body = smoke_config(workers=8, steps=16, step_s=0.5, smoke={"job": {"array_parallelism": 4}})
    run, job = _submit(workdir, body)

    # while it runs: at most 4 running (the %4 limit), the rest pending with Slurm's reason
    def first_four_running_with_heartbeats() -> dict | None:  # a task runs a moment before its first heartbeat
        s = status(run)["roles"]["smoke"]
        running = [t for t in s["detail"] if t["status"] == "RUNNING"]
        assert len(running) <= 4, running
        heartbeats = all(t["heartbeat_age_s"] is not None for t in running)
        return s if len(running) == 4 and heartbeats and s["counts"]["pending"] else None

    st = wait_for(first_four_running_with_heartbeats, 60, "4 running tasks with heartbeats, 4 pending")
    assert st["job_ids"] == [job]
    assert st["counts"]["running"] + st["counts"]["pending"] + st["counts"]["done"] == 8
    pending = [t for t in st["detail"] if t["status"] == "PENDING"]
    assert pending and all(t["reason"] == "JobArrayTaskLimit" for t in pending)
    running = [t for t in st["detail"] if t["status"] == "RUNNING"]
    assert all(t["job_id"].startswith(f"{job}_") and t["progress"].endswith("/16 steps") for t in running)
    # after: all done, and Slurm agrees
    wait_for(lambda: status(run)["roles"]["smoke"]["counts"]["done"] == 8, 120, "8 tasks done")
    rows = wait_for(
        lambda: (r := _sacct(job)) and len(r) == 8 and all(x.endswith("|COMPLETED") for x in r) and r,
        30,
        "sacct to record all 8 completions",
    )
    assert sorted(rows) == sorted(f"{job}_{i}|COMPLETED" for i in range(8))
    assert [task_state(run, t)["step"] for t in range(8)] == [16] * 8
    assert "smoke            8     8     0     0     0" in sarl("status", str(run), cwd=workdir).stdout


def test_preempted_role_checkpoints_requeues_and_resumes(workdir: Path, slurm: None) -> None:
    # two array tasks of 4 CPUs fill the node: the urgent job can only run by preempting them
    body = smoke_config(workers=2, steps=40, step_s=0.5, smoke={"job": {"cpus_per_task": 4, "time_min": 30}})
    run, job = _submit(workdir, body)
    wait_for(
        lambda: all(
            (run / f"checkpoints/smoke/task-00000{t}.json").exists() and task_state(run, t)["step"] >= 4
            for t in range(2)
        ),
        60,
        "4 steps",
    )
    urgent = subprocess.run(
        ["sbatch", "--parsable", "-p", "urgent", "-c", "8", "-o", "/dev/null", "--wrap", "sleep 3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    wait_for(lambda: all(task_state(run, t)["checkpoints"] >= 1 for t in range(2)), 60, "preemption checkpoints")
    wait_for(lambda: all(task_state(run, t).get("done") for t in range(2)), 120, "the requeued tasks to finish")
    for t in range(2):
        s = task_state(run, t)
        assert s["step"] == 40
        assert len(s["starts"]) == 2 and s["starts"][0]["from"] == "0/40 steps"
        assert int(s["starts"][1]["from"].split("/")[0]) >= 4  # continued from the saved step, not zero
        assert all(st["job_id"] == f"{job}_{t}" for st in s["starts"])  # the same array task, requeued
    rows = _sacct(job)
    assert any(r.endswith(("|REQUEUED", "|PREEMPTED")) for r in rows), rows
    # `sarl logs`: both attempts of the requeued task, from the one pair of files Slurm appended to,
    # each part under its own start; submitit's lines of the second start go with the second
    logs = sarl("logs", str(run), "smoke/0", "-n", "0", cwd=workdir).stdout
    parts = re.findall(r"^==> smoke/0 #(\d) \(job (\S+) on .*\) (stdout|stderr): (\S+) <==$", logs, re.M)
    assert [(n, j, s) for n, j, s, _ in parts] == [
        ("1", f"{job}_0", "stderr"),
        ("1", f"{job}_0", "stdout"),
        ("2", f"{job}_0", "stderr"),
        ("2", f"{job}_0", "stdout"),
    ], logs
    assert len({f for *_, f in parts}) == 2  # one stderr file and one stdout file
    stdout_parts = [chunk for chunk in logs.split("==> ") if chunk.startswith("smoke/0 #") and " stdout: " in chunk]
    assert [c.count("Starting with JobEnvironment") for c in stdout_parts] == [1, 1], logs
    assert f"{urgent}|COMPLETED" in wait_for(lambda: _sacct(urgent), 30, "urgent job in sacct")


def test_scancelled_role_is_reported_failed_and_resume_continues(workdir: Path, slurm: None) -> None:
    run, job = _submit(workdir, smoke_config(workers=2, steps=30, step_s=0.5))
    wait_for(
        lambda: all(
            (run / f"checkpoints/smoke/task-00000{t}.json").exists() and task_state(run, t)["step"] >= 3
            for t in range(2)
        ),
        60,
        "3 steps",
    )
    subprocess.run(["scancel", job], check=True)
    st = wait_for(
        lambda: (s := status(run)["roles"]["smoke"])["counts"]["failed"] == 2 and s, 60, "both tasks reported failed"
    )
    for t in st["detail"]:
        assert t["status"] == "CANCELLED"
        assert "CANCELLED by root (uid 0)" in t["reason"]
    text = sarl("status", str(run), cwd=workdir).stdout
    assert "why: CANCELLED by root (uid 0)" in text and "sarl resume" in text
    saved = [task_state(run, t)["step"] for t in range(2)]
    out = sarl("resume", str(run), cwd=workdir)
    new_job = out.stdout.split()[3]
    assert new_job != job and "(2 tasks)" in out.stdout
    # a second resume while they run submits nothing
    again = sarl("resume", str(run), cwd=workdir)
    assert again.stdout == "" and "nothing to resubmit" in again.stderr
    wait_for(lambda: status(run)["roles"]["smoke"]["counts"]["done"] == 2, 120, "resumed tasks")
    for t in range(2):
        s = task_state(run, t)
        assert s["step"] == 30
        assert [x["job_id"] for x in s["starts"]] == [f"{job}_{t}", f"{new_job}_{t}"]
        assert int(s["starts"][1]["from"].split("/")[0]) >= saved[t]


def test_sarl_cancel_cancels_every_live_job(workdir: Path, slurm: None) -> None:
    run, job = _submit(workdir, smoke_config(workers=3, steps=100, step_s=0.5))
    wait_for(lambda: status(run)["roles"]["smoke"]["counts"]["running"] == 3, 60, "3 running")
    out = sarl("cancel", str(run), cwd=workdir)
    assert out.stdout.strip() == f"cancelled smoke: {job}"
    wait_for(lambda: not any(i.startswith(f"{job}_") for i in _squeue_ids()), 60, "squeue to drop the job")
    st = wait_for(lambda: (s := status(run)["roles"]["smoke"])["counts"]["failed"] == 3 and s, 60, "3 cancelled")
    assert {t["status"] for t in st["detail"]} == {"CANCELLED"}


def test_failed_task_reports_its_exception(workdir: Path, slurm: None) -> None:
    run, job = _submit(workdir, smoke_config(workers=2, steps=4, step_s=0.2, smoke={"fail_tasks": [0]}))
    st = wait_for(
        lambda: (s := status(run)["roles"]["smoke"])["counts"]["failed"] == 1 and s["counts"]["done"] == 1 and s,
        90,
        "one failure, one done",
    )
    t0 = st["detail"][0]
    assert t0["status"] == "FAILED" and t0["job_id"] == f"{job}_0"
    assert "exit 1:0" in t0["reason"] and "RuntimeError: smoke task 0 fails at step 2" in t0["reason"]


def test_bad_config_submits_nothing_to_slurm(workdir: Path, slurm: None) -> None:
    before = _squeue_ids()
    cfg = write_config(workdir, smoke_config(smoke={"job": {"gpus": 1}}))
    out = sarl("submit", str(cfg), "--cluster", "slurm", cwd=workdir, check=False)
    assert out.returncode == 2 and "smoke.job.gpus: unknown key" in out.stderr
    assert _squeue_ids() - before == set()
    assert not (workdir / "runs").exists()


def test_scheduler_refusal_leaves_no_run_directory(workdir: Path, slurm: None) -> None:
    cfg = write_config(workdir, smoke_config(executor={"type": "slurm", "partition": "nosuch"}))
    out = sarl("submit", str(cfg), cwd=workdir, check=False)
    assert out.returncode == 1
    assert "submission failed" in out.stderr and "invalid partition" in out.stderr.lower()
    assert not (workdir / "runs" / "t").exists()


def test_gpu_partition_gets_a_gpu(workdir: Path, slurm: None) -> None:
    body = smoke_config(workers=1, steps=1, step_s=0, smoke={"job": {"partition": "gpu", "gpus_per_task": 1}})
    run, job = _submit(workdir, body)
    wait_for(lambda: status(run)["roles"]["smoke"]["counts"]["done"] == 1, 60, "gpu task done")

    def alloc() -> str:
        return subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job, "-o", "Partition,AllocTRES"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    out = wait_for(lambda: (a := alloc()).startswith("gpu|") and a, 30, "sacct to record the partition")
    assert "gres/gpu=1" in out


def test_bench_submit_reports_each_figure_beside_its_baseline(workdir: Path, slurm: None) -> None:
    out = sarl("bench", "submit", "--quick", "--json", "--tasks", "50", cwd=workdir)
    r = json.loads(out.stdout)
    assert r["tasks"] == 50 and r["repetitions"] == 3
    assert r["sarl_submit_s"] > 0 and r["sbatch_submit_s"] > 0
    assert abs(r["ratio"] - r["sarl_submit_s"] / r["sbatch_submit_s"]) < 0.02 * r["ratio"]
    assert set(r) >= {"python_sbatch_s", "stock_submitit_s", "ratio_vs_python_sbatch", "speedup_vs_stock_submitit"}
    names = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, check=True).stdout.split()
    assert not {n for n in names if n.startswith("sarl-bench") or n in ("job.sh", "submitit")}  # none left queued


def test_status_tells_what_it_knows_when_slurm_does_not_answer(workdir: Path, slurm: None) -> None:
    import os

    run, job = _submit(workdir, smoke_config(workers=2, steps=100, step_s=0.5))
    wait_for(
        lambda: all(
            (run / f"checkpoints/smoke/task-00000{t}.json").exists() and task_state(run, t)["step"] >= 1
            for t in range(2)
        ),
        60,
        "both tasks to commit a step",
    )
    # the real squeue and sacct, failing at once on an empty configuration
    (workdir / "empty-slurm.conf").write_text("")
    env = dict(os.environ, SLURM_CONF=str(workdir / "empty-slurm.conf"))
    st = json.loads(sarl("status", str(run), "--json", cwd=workdir, env=env).stdout)
    assert len(st["warnings"]) == 1 and st["warnings"][0].startswith("Slurm did not answer")
    detail = st["roles"]["smoke"]["detail"]
    assert [t["status"] for t in detail] == ["UNKNOWN", "UNKNOWN"]
    assert all(t["progress"].endswith("/100 steps") and t["heartbeat_age_s"] is not None for t in detail)
    assert st["roles"]["smoke"]["counts"]["failed"] == 0
    text = sarl("status", str(run), cwd=workdir, env=env).stdout
    assert "WARNING: Slurm did not answer" in text
    for cmd in ("resume", "cancel"):  # neither acts blind: tasks may still be running
        out = sarl(cmd, str(run), cwd=workdir, env=env, check=False)
        assert out.returncode == 1 and "nothing" in out.stderr, (cmd, out.stderr)
    assert len(list((run / "submissions" / "smoke").glob("*.json"))) == 1
    sarl("cancel", str(run), cwd=workdir)
