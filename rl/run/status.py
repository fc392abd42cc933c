"""`sarl status`: what each role's tasks are doing, from the run directory and
the scheduler alone (so it works from any login node, after the submitting
shell is gone).

A task's status joins three sources:
  * its committed state in checkpoints/ROLE/ (done? how far? how often started)
  * its heartbeat in heartbeats/ROLE/ (last sign of life)
  * the scheduler's view of the newest submission that included it
    (Slurm: squeue for live tasks, sacct for finished ones; local: the
    controller process and submitit's result file).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rl.fsio import read_json
from rl.run.deaths import given_up
from rl.run.executors import LIVE_STATES, SubmitError, failure_text, local_state, slurm_states, submission_label
from rl.run.rundir import RunDir


@dataclass
class TaskStatus:
    task: int
    status: str
    """DONE, NOT_SUBMITTED, a live scheduler state (PENDING, RUNNING, ...), or
    the failure state (FAILED, CANCELLED, TIMEOUT, NODE_FAIL, DIED, ...)."""
    job_id: str = ""
    reason: str = ""
    progress: str = ""
    heartbeat_age_s: float | None = None
    starts: int = 0
    checkpoints: int = 0

    @property
    def live(self) -> bool:
        return self.status in LIVE_STATES

    @property
    def failed(self) -> bool:
        return not self.live and self.status not in ("DONE", "NOT_SUBMITTED", "UNKNOWN")


@dataclass
class RoleStatus:
    role: str
    tasks: int
    job_ids: list[str] = field(default_factory=list)
    detail: list[TaskStatus] = field(default_factory=list)
    scheduler_error: str = ""
    """Set when Slurm did not answer: task states come from the run directory only."""

    def count(self, pred: Any) -> int:
        return sum(1 for t in self.detail if pred(t))

    @property
    def counts(self) -> dict[str, int]:
        return {
            "done": self.count(lambda t: t.status == "DONE"),
            "running": self.count(lambda t: t.status == "RUNNING"),
            "pending": self.count(lambda t: t.live and t.status != "RUNNING"),
            "failed": self.count(lambda t: t.failed),
            "unknown": self.count(lambda t: t.status == "UNKNOWN"),
            "not_submitted": self.count(lambda t: t.status == "NOT_SUBMITTED"),
        }

    @property
    def last_heartbeat_s(self) -> float | None:
        ages = [t.heartbeat_age_s for t in self.detail if t.heartbeat_age_s is not None]
        return min(ages) if ages else None


def role_status(rd: RunDir, role: str, ntasks: int, now: float | None = None) -> RoleStatus:
    """Each task of a role: its state, heartbeat and job as the scheduler
    sees it, and why a failed one failed."""
    now = time.time() if now is None else now
    records = rd.submissions(role)
    out = RoleStatus(role=role, tasks=ntasks, job_ids=[submission_label(r) for r in records])
    latest: dict[int, tuple[dict[str, Any], int]] = {}  # task -> (record, index in its array)
    for rec in records:
        for i, t in enumerate(rec["tasks"]):
            latest[t] = (rec, i)
    slurm_ids = sorted({str(r["job_id"]) for r, _ in latest.values() if r["executor"] == "slurm"})
    try:
        sstates = slurm_states(slurm_ids)
    except SubmitError as e:  # tell what the run directory knows, and say what is missing
        sstates = {}
        out.scheduler_error = f"Slurm did not answer ({e})"
    for task in range(ntasks):
        out.detail.append(_task_status(rd, role, task, now, latest.get(task), sstates, out.scheduler_error))
    return out


def _task_status(
    rd: RunDir,
    role: str,
    task: int,
    now: float,
    submitted: tuple[dict[str, Any], int] | None,
    sstates: dict[str, dict[str, str]],
    scheduler_error: str,
) -> TaskStatus:
    state = read_json(rd.state_path(role, task)) or {}
    beat = read_json(rd.heartbeat_path(role, task)) or {}
    ts = TaskStatus(
        task=task,
        status="NOT_SUBMITTED",
        progress=beat.get("progress", ""),
        heartbeat_age_s=round(now - beat["at"], 1) if "at" in beat else None,
        starts=len(state.get("starts", [])),
        checkpoints=state.get("checkpoints", 0),
    )
    if beat.get("waiting"):
        ts.progress = f"waiting {beat['waiting']}"
    if submitted is not None:
        _scheduled(ts, rd, state, submitted, sstates, scheduler_error)
    if state.get("done"):
        ts.status = "DONE"
        if state.get("ended_as"):  # how a task ended that its own process did not finish (given up, taken over)
            ts.progress = state["ended_as"]
    elif ts.failed:
        stopped = given_up(rd, role, task)
        if stopped:  # the watchers no longer start it (rl.run.recovery)
            ts.reason = f"not restarted: {stopped}" + (f"; {ts.reason}" if ts.reason else "")
    return ts


def _scheduled(
    ts: TaskStatus,
    rd: RunDir,
    state: dict[str, Any],
    submitted: tuple[dict[str, Any], int],
    sstates: dict[str, dict[str, str]],
    scheduler_error: str,
) -> None:
    """The task's job as its scheduler sees it; for a job that ended without
    finishing the task, why."""
    rec, idx = submitted
    if rec["executor"] == "slurm":
        ts.job_id = rec["job_ids"][idx]
        missing = {"state": "SUBMITTED", "detail": "SUBMITTED", "exit_code": "",
                   "reason": "not yet visible in squeue/sacct", "node": ""}  # fmt: skip
        if scheduler_error:
            missing = {"state": "UNKNOWN", "detail": "UNKNOWN", "exit_code": "", "reason": scheduler_error, "node": ""}
        sched = sstates.get(ts.job_id, missing)
    else:
        ts.job_id = f"pid {rec['job_ids'][idx]}"
        sched = local_state(rd, rec, idx)
    ts.status = sched["state"]
    if ts.status == "SUBMITTED":
        ts.status = "PENDING"
    if ts.live:
        if sched["reason"] not in ("", "None"):
            ts.reason = sched["reason"]
    elif not state.get("done"):
        job = ts.job_id if rec["executor"] == "slurm" else rec["job_ids"][idx]
        why = [sched["detail"]]
        if sched["exit_code"] not in ("", "0:0", "0"):
            why.append(f"exit {sched['exit_code']}")
        if sched["reason"] not in ("", "None"):
            why.append(sched["reason"])
        err = failure_text(rd, rec, job) if ts.status != "CANCELLED" else ""  # the cancel is the why, not a log line
        if err:
            why.append(err)
        if ts.status == "COMPLETED":  # the job ended, the role did not finish
            ts.status = "FAILED"
            why.insert(0, "job completed without finishing the task")
        ts.reason = "; ".join(w for w in why if w)


def store_damage(rd: RunDir) -> list[dict[str, str]]:
    """Damaged entries of the run's store that the roles skip: batches,
    unreadable pins, and the newest weight version if it cannot be read
    (`sarl store inspect` lists every kind)."""
    store = rd.store_path
    if not store.is_dir():
        return []
    from rl.store import Damage, Store, StoreError

    s = Store(store)
    reader = s.reader()
    reader.committed()
    damage = list(reader.damaged)
    ws = s.weights
    ws.pinned()
    damage += ws.damaged
    for v in ws.versions()[-1:]:  # the one generators would load
        try:
            ws.manifest(v)
        except StoreError as e:
            damage.append(Damage(str(ws.path(v)), str(e)))
    return [{"path": d.path, "reason": d.reason} for d in damage]


def run_status(rd: RunDir, store: bool = True, disk: bool = True) -> dict[str, Any]:
    """Every role's tasks; with `store`, also the store's damaged entries;
    with `disk`, the run folder's disk use (a walk of the whole folder: not
    for a poll every second)."""
    cfg = rd.config()
    roles = [role_status(rd, name, rc.workers) for name, rc in cfg.roles().items()]
    from rl.run.disk import disk_use
    from rl.run.overview import overview

    learner_running = any(r.role == "learner" and r.counts["running"] > 0 for r in roles)
    return {
        "training": overview(rd, cfg, learner_running),
        **({"disk": disk_use(rd.path)} if disk else {}),
        "store_damaged": store_damage(rd) if store else [],
        "run_dir": str(rd.path),
        "name": cfg.run.name,
        "executor": cfg.executor.type,
        "warnings": sorted({r.scheduler_error for r in roles if r.scheduler_error}),
        "roles": {
            r.role: {
                "tasks": r.tasks,
                "job_ids": r.job_ids,
                "counts": r.counts,
                "last_heartbeat_s": r.last_heartbeat_s,
                "detail": [asdict(t) for t in r.detail],
            }
            for r in roles
        },
    }


def _age(s: float | None) -> str:
    if s is None:
        return "never"
    if s < 120:
        return f"{s:.0f}s ago"
    if s < 7200:
        return f"{s / 60:.0f}m ago"
    return f"{s / 3600:.1f}h ago"


def render(st: dict[str, Any], all_tasks: bool = False) -> str:
    lines = [f"run {st['name']}  ({st['run_dir']}, executor {st['executor']})", ""]
    for w in st.get("warnings", []):
        lines[1:1] = [f"WARNING: {w}; task states below come from the run directory only", ""]
    damaged = st.get("store_damaged", [])
    if damaged:
        lines[1:1] = [
            f"WARNING: {len(damaged)} damaged entries in the store are skipped "
            f"(`sarl store inspect {st['run_dir']}` lists them); first: {damaged[0]['path']}: {damaged[0]['reason']}",
            "",
        ]
    from rl.run.overview import render_overview

    glance = render_overview(st.get("training", {}))
    if glance:
        lines += [*glance, ""]
    if "disk" in st:
        from rl.run.disk import render_disk

        lines += [render_disk(st["disk"]), ""]
        if st["disk"]["warning"]:
            lines[1:1] = [f"WARNING: {st['disk']['warning']}", ""]
    header = f"{'ROLE':<12}{'TASKS':>6}{'DONE':>6}{'RUN':>6}{'PEND':>6}{'FAIL':>6}  {'LAST BEAT':<11} JOBS"
    lines.append(header)
    for name, r in st["roles"].items():
        c = r["counts"]
        pend = c["pending"] + c["not_submitted"]
        lines.append(
            f"{name:<12}{r['tasks']:>6}{c['done']:>6}{c['running']:>6}{pend:>6}{c['failed']:>6}  "
            f"{_age(r['last_heartbeat_s']):<11} {', '.join(r['job_ids']) or '-'}"
        )
    failed_any = False
    for name, r in st["roles"].items():
        shown = [
            t
            for t in r["detail"]
            if all_tasks or t["status"] not in ("DONE",) and (len(r["detail"]) <= 16 or t["status"] != "PENDING")
        ]
        if not shown:
            continue
        lines += ["", f"{name} tasks:"]
        for t in shown:
            beat = f", beat {_age(t['heartbeat_age_s'])}" if t["heartbeat_age_s"] is not None else ""
            restarts = f", started {t['starts']}x" if t["starts"] > 1 else ""
            ck = f", {t['checkpoints']} checkpoint(s)" if t["checkpoints"] else ""
            lines.append(f"  {t['task']:>5}  {t['status']:<13} {t['job_id']:<14} {t['progress']}{beat}{restarts}{ck}")
            if t["reason"]:
                lines.append(f"         why: {t['reason']}")
            failed_any |= t["status"] not in ("DONE", "NOT_SUBMITTED", "RUNNING", "PENDING", "REQUEUED") and bool(
                t["reason"]
            )
    if failed_any:
        lines += ["", f"Failed tasks keep their state; `sarl resume {st['run_dir']}` resubmits them."]
    return "\n".join(lines)
