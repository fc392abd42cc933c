"""Submit, resume and cancel the roles of a run.

`submit` into a new run directory creates it (frozen config) and submits every
task of every role. `submit` into an existing one, and `resume`, submit only
the tasks that are neither done nor alive in the scheduler; they continue from
their committed state. A command that fails before any job was submitted
leaves no run directory behind.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from rl.config import Config, ConfigError
from rl.fsio import write_json
from rl.run import deaths
from rl.run.executors import SubmitError, cancel_submission, submission_label, submit_role
from rl.run.rundir import RunDir
from rl.run.status import role_status


@dataclass
class Submitted:
    role: str
    label: str
    tasks: list[int]


def submit(cfg: Config, source: str, say: Callable[[str], None] = print) -> list[Submitted]:
    """Create the run and submit every task of every role; into an existing
    run, submit the tasks that are neither done nor alive (and say so)."""
    cfg.require_roles(source)
    rd = RunDir(cfg.run_dir)
    if not rd.exists():
        try:
            rd.create(cfg)
        except FileExistsError:
            if not rd.exists():
                raise ConfigError(
                    f"{source}: run.name: {rd.path} exists and is not a run directory (no run.toml); "
                    "choose another run.name or run.root"
                ) from None
            # a concurrent submit created it first: go on as into an existing run
        else:
            return _submit_new(rd, cfg)
    return resume(rd, cfg, source, say)


def _submit_new(rd: RunDir, cfg: Config) -> list[Submitted]:
    with rd.lock():
        done: list[Submitted] = []
        try:
            for role, rc in cfg.roles().items():
                rec = submit_role(rd, cfg, role, list(range(rc.workers)))
                done.append(Submitted(role, submission_label(rec), rec["tasks"]))
        except BaseException:
            if not done:  # nothing runs: leave nothing behind
                shutil.rmtree(rd.path, ignore_errors=True)
            raise
    return done


def resume(
    rd: RunDir, cfg: Config | None = None, source: str = "", say: Callable[[str], None] = print
) -> list[Submitted]:
    """Resubmit the tasks of a run that are neither done nor alive, after
    accepting the mid-run-safe changes of `cfg`; say what was resubmitted,
    or why nothing was."""
    with rd.lock():
        if cfg is not None:
            changed = rd.accept(cfg, source)
            if changed:
                say(f"accepted mid-run changes: {', '.join(changed)}")
        frozen = rd.config()
        subs = _resubmit(rd, frozen)
    if subs:
        say(f"resumed {rd.path}: " + ", ".join(f"{s.role} tasks {_spans(s.tasks)}" for s in subs))
    else:
        counts = {role: role_status(rd, role, rc.workers).counts for role, rc in frozen.roles().items()}
        say(
            f"nothing to resubmit in {rd.path}: every task is done or alive ("
            + "; ".join(f"{role}: {c['done']} done, {c['running'] + c['pending']} alive" for role, c in counts.items())
            + ")"
        )
    return subs


def _spans(tasks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    for t in tasks:
        if out and out[-1].split("-")[-1] == str(t - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{t}"
        else:
            out.append(str(t))
    return ",".join(out)


def _resubmit(rd: RunDir, cfg: Config) -> list[Submitted]:
    rd.cancelled_path.unlink(missing_ok=True)  # a person brings the run back: its watchers with it
    out = []
    for role, rc in cfg.roles().items():
        st = role_status(rd, role, rc.workers)
        if st.scheduler_error:  # its tasks may still run: resubmitting them could run them twice
            raise SubmitError(f"{role}: {st.scheduler_error}; nothing resubmitted")
        todo = [t.task for t in st.detail if t.status != "DONE" and not t.live]
        if todo:
            deaths.clear(rd, role, todo)  # a person takes over: a crash loop's count starts again
            rec = submit_role(rd, cfg, role, todo)
            out.append(Submitted(role, submission_label(rec), todo))
    return out


def cancel(rd: RunDir) -> list[str]:
    """Cancel every submission of the run that still has a live task."""
    cfg = rd.config()
    cancelled = []
    with rd.lock():
        write_json(rd.cancelled_path, {"at": time.time()})  # the run's watchers stand down, even after a failure
        for role, rc in cfg.roles().items():
            st = role_status(rd, role, rc.workers)
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
