"""Submit, resume and cancel the roles of a run.

`submit` into a new run directory creates it (frozen config) and submits every
task of every role. `submit` into an existing one, and `resume`, submit only
the tasks that are neither done nor alive in the scheduler; they continue from
their committed state. A command that fails before any job was submitted
leaves no run directory behind.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass

from rl.cluster import SubmitError, cancel_submission, submission_label, submit_role
from rl.config import Config
from rl.rundir import RunDir
from rl.status import role_status


@dataclass
class Submitted:
    role: str
    label: str
    tasks: list[int]


def submit(cfg: Config, source: str, say: Callable[[str], None] = print) -> list[Submitted]:
    rd = RunDir(cfg.run_dir)
    if rd.exists():
        with rd.lock():
            changed = rd.accept(cfg, source)
            if changed:
                say(f"accepted mid-run changes: {', '.join(changed)}")
            return _resubmit(rd, rd.config())
    try:
        rd.create(cfg)
    except FileExistsError:  # a concurrent submit created it first: resume instead
        return submit(cfg, source, say)
    with rd.lock():
        done: list[Submitted] = []
        try:
            for role, rc in cfg.roles().items():
                rec = submit_role(rd, cfg, role, list(range(rc.tasks)))
                done.append(Submitted(role, submission_label(rec), rec["tasks"]))
        except BaseException:
            if not done:  # nothing runs: leave nothing behind
                shutil.rmtree(rd.path, ignore_errors=True)
            raise
    return done


def resume(rd: RunDir, cfg: Config | None = None, source: str = "") -> list[Submitted]:
    with rd.lock():
        if cfg is not None:
            rd.accept(cfg, source)
        return _resubmit(rd, rd.config())


def _resubmit(rd: RunDir, cfg: Config) -> list[Submitted]:
    out = []
    for role, rc in cfg.roles().items():
        st = role_status(rd, role, rc.tasks)
        if st.scheduler_error:  # its tasks may still run: resubmitting them could run them twice
            raise SubmitError(f"{role}: {st.scheduler_error}; nothing resubmitted")
        todo = [t.task for t in st.detail if t.status != "DONE" and not t.live]
        if todo:
            rec = submit_role(rd, cfg, role, todo)
            out.append(Submitted(role, submission_label(rec), todo))
    return out


def cancel(rd: RunDir) -> list[str]:
    """Cancel every submission of the run that still has a live task."""
    cfg = rd.config()
    cancelled = []
    with rd.lock():
        for role, rc in cfg.roles().items():
            st = role_status(rd, role, rc.tasks)
            if st.scheduler_error:
                raise SubmitError(f"{role}: {st.scheduler_error}; nothing cancelled")
            live_jobs = {t.job_id for t in st.detail if t.live}
            for rec in rd.submissions(role):
                ids = rec["job_ids"] if rec["executor"] == "slurm" else [f"pid {p}" for p in rec["job_ids"]]
                if live_jobs.intersection(ids):
                    cancel_submission(rec)
                    rd.mark_cancelled(rec)
                    cancelled.append(f"{role}: {submission_label(rec)}")
    return cancelled
