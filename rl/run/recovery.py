"""Recovery without a human (`[run.recovery]`, on by default).

There is no controller. Every task's process beats (rl.run.heartbeat), so
a heartbeat older than `hung_s` means that the process itself no longer
runs: stopped (SIGSTOP), on a frozen node, stuck in the kernel; a fresh
beat whose `progress_at` is older than `stall_s` means that the process
runs but its work stands still (a deadlock, a request that never
returns). Both are hung. Task 0 of each role also runs a `Watcher`
thread: every
`check_s` it reads the run's status as `sarl status` does (the run
directory, and squeue/sacct or the local processes). When some task is dead
or hung, it starts `python -m rl.run.recovery RUN_DIR` with its own job's
SLURM_* and SUBMITIT_* variables removed, so that none leaks into the new
submission. That process takes the run's lock without waiting (another
watcher, or a person's `sarl resume`, holding it does the same work), looks
again, and then:

  * cancels each hung task (a heartbeat from its current job older than
    `hung_s`, or one whose `progress_at` is older than `stall_s`); the
    cancelled task is dead at the next look;
  * records each dead task's death once per job (job id, state, reason) in
    RUN_DIR/recovery/ROLE/task-NNNNNN.json (rl.run.deaths);
  * resubmits the dead tasks as `sarl resume` does (they continue from their
    committed state), except a task that died `max_restarts` times within
    `window_s`: that one is given up with the reason, which `sarl status`
    shows. `sarl resume` clears the record and starts it once more.
  * asks each role, through the hooks of its Role class (rl.run.role),
    what it needs besides: what to do with a given-up task's work
    (`on_given_up`: the rollout workers hand its share of the groups to
    another worker), and which of its tasks must start again although
    they did not die (`restart_also`: a worker that ended before a share
    was handed to it). Generic recovery knows no role by name.
    After `sarl cancel` the watchers start nothing until `sarl resume`
    (on Slurm a cancelled job may run on for a while, its watcher with it).

Not covered:
  * a run whose every watcher (task 0 of every role) died at once has nobody
    left to bring it back: `sarl resume`;
  * progress is what each role's loop says it is: a learner waiting for
    batches, or a worker held by the staleness gate, waits on another
    role and is not stalled; a worker whose episodes all wait for a
    missing generator is, once that lasts `stall_s`. A stall is found only
    after `stall_s`, which must exceed the longest legitimate silence (a
    start-up, a learner step, an episode);
  * a task that hangs before its first beat (in its imports) is not detected.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from rl.config import Config
from rl.fsio import read_json, write_json
from rl.run.deaths import given_up, record_path
from rl.run.executors import cancel_tasks, role_class, submit_role
from rl.run.rundir import RunDir
from rl.run.status import role_status

log = logging.getLogger("sarl.recovery")


@dataclass
class Remedy:
    """What a look at the run found to do for one task."""

    role: str
    task: int
    kind: str
    """`dead` (resubmit it), `hung` (cancel it first), or `restart` (its
    role asked for it to start again: `Role.restart_also`)."""
    job_id: str
    """The job the task last ran as (`12_3`, or a local controller's pid)."""
    reason: str


def look(rd: RunDir, cfg: Config, now: float | None = None) -> list[Remedy]:
    """Every task that is dead (and not given up) or hung, and every task
    its role asks to start again, from the run directory and the scheduler
    alone."""
    now = time.time() if now is None else now
    hung_s, stall_s = cfg.run.recovery.hung_s, cfg.run.recovery.stall_s
    out: list[Remedy] = []
    if rd.cancelled_path.exists():  # a person cancelled the run: it stays down until `sarl resume`
        return out
    for role, rc in cfg.roles().items():
        st = role_status(rd, role, rc.workers, now)
        if st.scheduler_error:  # its tasks may still run: acting now could run them twice
            continue
        for t in st.detail:
            job = t.job_id.removeprefix("pid ")
            if t.status == "RUNNING":
                beat = read_json(rd.heartbeat_path(role, t.task)) or {}
                age = now - float(beat.get("at", now))
                if str(beat.get("job_id")) != job:  # a predecessor's beat: this job has not beaten yet
                    continue
                still = now - float(beat.get("progress_at", now))
                if age > hung_s:
                    out.append(Remedy(role, t.task, "hung", job, f"no heartbeat for {age:.0f} s"))
                elif still > stall_s:
                    why = f"stalled: no progress for {still:.0f} s while its heartbeat is fresh"
                    out.append(Remedy(role, t.task, "hung", job, why))
            elif t.failed and not given_up(rd, role, t.task):
                out.append(Remedy(role, t.task, "dead", job, f"{t.status}: {t.reason}".rstrip(": ")))
        jobs = {t.task: t.job_id.removeprefix("pid ") for t in st.detail}
        for task, why in role_class(role).restart_also(rd, rc.workers):
            out.append(Remedy(role, task, "restart", jobs.get(task, ""), why))
    return out


def recover(rd: RunDir) -> list[Remedy]:
    """One round, under the run's lock: cancel the hung, record the deaths,
    resubmit the dead that are not in a crash loop. Returns what it did."""
    with rd.lock(wait=False) as got:
        if not got:
            return []
        cfg = rd.config()
        rc = cfg.run.recovery
        done: list[Remedy] = []
        resubmit: dict[str, list[int]] = {}
        for a in look(rd, cfg):
            if a.kind == "restart":
                role_class(a.role).before_restart(rd, a.task)
                resubmit.setdefault(a.role, []).append(a.task)
                done.append(a)
                continue
            path = record_path(rd, a.role, a.task)
            rec: dict[str, Any] = read_json(path) or {"deaths": []}
            if not any(d["job_id"] == a.job_id for d in rec["deaths"]):  # once per job; a hung one's why, not CANCELLED
                rec["deaths"].append({"job_id": a.job_id, "at": time.time(), "reason": a.reason})
            if a.kind == "hung":
                record = _submission_of(rd, a.role, a.task)
                if record is not None:
                    write_json(path, rec)
                    cancel_tasks(record, [a.task])
                    log.warning("%s task %d is hung (%s): cancelled", a.role, a.task, a.reason)
                    done.append(a)
                continue
            recent = [d for d in rec["deaths"] if time.time() - d["at"] <= rc.window_s]
            if len(recent) > rc.max_restarts:
                rec["given_up"] = (
                    f"crash loop: died {len(recent)} times in {rc.window_s:.0f} s "
                    f"(run.recovery.max_restarts = {rc.max_restarts}); last: {a.reason}"
                )
                log.error("%s task %d: %s", a.role, a.task, rec["given_up"])
                rec.update(_on_given_up(rd, cfg, a.role, a.task))
            else:
                resubmit.setdefault(a.role, []).append(a.task)
                done.append(a)
            write_json(path, rec)
        for role, tasks in resubmit.items():
            submit_role(rd, cfg, role, tasks)
            log.warning("%s tasks %s were dead: resubmitted", role, tasks)
        return done


def _on_given_up(rd: RunDir, cfg: Config, role: str, task: int) -> dict[str, Any]:
    """What the role does with a given-up task's work (`Role.on_given_up`),
    told which of its tasks run and which are given up already."""
    n = cfg.roles()[role].workers
    running = {t.task for t in role_status(rd, role, n).detail if t.live}
    out = {t for t in range(n) if given_up(rd, role, t)} | {task}
    return role_class(role).on_given_up(rd, task, n, running, out)


def _submission_of(rd: RunDir, role: str, task: int) -> dict[str, Any] | None:
    """The newest submission record that holds `task`."""
    for rec in reversed(rd.submissions(role)):
        if task in rec["tasks"]:
            return rec
    return None


def clean_env() -> dict[str, str]:
    """This process's environment less its own job's Slurm and submitit
    variables, which would otherwise reach the jobs it submits."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}


class Watcher(threading.Thread):
    """Task 0 of a role: looks at the run every `check_s`, and when a task is
    dead or hung starts the recovery round in a process of its own."""

    def __init__(self, run_dir: str, check_s: float):
        super().__init__(name="sarl-watch", daemon=True)
        self.rd, self.check_s, self.stop = RunDir(run_dir), check_s, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.check_s):
            try:
                if look(self.rd, self.rd.config()):
                    cmd = [sys.executable, "-m", "rl.run.recovery", str(self.rd.path)]
                    out = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=300)
                    if out.returncode != 0:
                        log.error("recovery round failed: %s", out.stderr.strip()[-2000:])
            except Exception:  # the watcher outlives a bad round (Slurm did not answer, a torn file)
                log.exception("recovery look failed")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for a in recover(RunDir(sys.argv[1])):
        print(f"{a.kind} {a.role} {a.task} {a.job_id}: {a.reason}")
