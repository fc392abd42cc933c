"""Submitting roles through submitit, and asking the scheduler about them.

Executors are chosen by the config's `executor.type`, never by what happens to
be installed: a machine with a Slurm client still runs a `local` run locally.

* `slurm`: `submitit.SlurmExecutor`; one job array per submission.
* `local`: `submitit.LocalExecutor`, but each task's controller is started in
  a session of its own, so that it outlives the shell that ran `sarl submit`
  (as an sbatch job would), and without the submitting shell's SLURM_*
  variables (which would make the job believe it runs under Slurm).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import pwd
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import cloudpickle
import submitit
import submitit.core.core
from submitit.core.utils import JobPaths
from submitit.local.local import LocalJob
from submitit.slurm.slurm import SlurmJob

from rl.config import ROLES, Config, RoleConfig, SlurmExecutor
from rl.errors import SarlError
from rl.layout import RunLayout
from rl.run.rundir import RunDir


class RoleClass(Protocol):
    """What the run machinery uses of a role's class (rl.run.role.Role): it
    is found through the registry by name, so this side names no class."""

    def __call__(self, run_dir: str) -> Callable[[int], dict[str, Any]]: ...

    def restart_also(self, rd: RunLayout, tasks: int) -> list[tuple[int, str]]: ...

    def before_restart(self, rd: RunLayout, task: int) -> None: ...

    def on_given_up(
        self, rd: RunLayout, task: int, tasks: int, running: set[int], given_up: set[int]
    ) -> dict[str, Any]: ...


LIVE_STATES = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
    "RESV_DEL_HOLD",
}


class SubmitError(SarlError, RuntimeError):
    """The scheduler refused a submission."""


def role_class(name: str) -> RoleClass:
    """The Role subclass that the jobs of role `name` run: the class that
    the one registry of roles (rl.config.ROLES) names, a thin entry point
    in `jobs/`. It is named there, not imported, because submitted jobs
    unpickle it by that name: the registry is the one place where the run
    machinery meets the entry points."""
    module, _, attr = ROLES[name].job_class.partition(":")
    cls: RoleClass = getattr(importlib.import_module(module), attr)
    return cls


# ------------------------------------------------------------------ executors


class DetachedLocalExecutor(submitit.LocalExecutor):
    """submitit's local executor, with each controller in a new session."""

    def _submit_command(self, command: str) -> LocalJob[Any]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
        env.update(
            SUBMITIT_LOCAL_NTASKS=str(self.parameters.get("tasks_per_node", 1)),
            SUBMITIT_LOCAL_COMMAND=command,
            SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * self.parameters.get("timeout_min", 60))),
            SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(int(self.parameters.get("signal_delay_s", 30))),
            SUBMITIT_LOCAL_NODEID="0",
            SUBMITIT_LOCAL_JOB_NUM_NODES="1",
            SUBMITIT_STDERR_TO_STDOUT="",
            SUBMITIT_EXECUTOR="local",
            SUBMITIT_LOCAL_WITH_SHELL="",
        )
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        with open(self.folder.parent / "local-controllers.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "submitit.local._local", str(self.folder)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return LocalJob(folder=self.folder, job_id=str(proc.pid), process=proc, tasks=[0])


class ArraySlurmExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor, with one pickle per array instead of one per task.

    submitit writes a pickle and a folder for every array task before it
    returns; for 1,000 tasks that is thousands of file creations on the
    shared filesystem's metadata server, on the submitting login node. Here
    the whole array is one pickle, and each task writes its own submitit
    pickle when it starts (`jobs.array_task`), on its compute node. A task
    that checkpointed keeps the pickle its checkpoint wrote.
    """

    def _internal_process_submissions(
        self, delayed_submissions: list[submitit.helpers.DelayedSubmission]
    ) -> list[submitit.core.core.Job[Any]]:
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)
        for d in delayed_submissions:
            d.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
        array_pickle = self.folder / f"array-{uuid.uuid4().hex}.pkl"
        with open(array_pickle, "wb") as f:
            cloudpickle.dump(delayed_submissions, f, pickle.HIGHEST_PROTOCOL)
        array_ex = ArraySlurmExecutor(self.folder, self.max_num_timeout)
        array_ex.update_parameters(**self.parameters)
        array_ex.parameters["map_count"] = len(delayed_submissions)
        command = " ".join(
            [self.python, "-u -m jobs.array_task", shlex.quote(str(self.folder)), shlex.quote(str(array_pickle))]
        )
        try:
            first = array_ex._submit_command(command)
        except BaseException:
            array_pickle.unlink()
            raise
        tasks = list(range(first.num_tasks))
        return [
            SlurmJob(folder=self.folder, job_id=f"{first.job_id}_{a}", tasks=tasks)
            for a in range(len(delayed_submissions))
        ]


def make_executor(cfg: Config, role: str, role_cfg: RoleConfig, folder: Path) -> submitit.Executor:
    job = role_cfg.job
    if isinstance(cfg.executor, SlurmExecutor):
        ex = cfg.executor
        slurm = ArraySlurmExecutor(folder=folder, max_num_timeout=ex.max_timeouts)
        params: dict[str, Any] = dict(
            job_name=f"sarl-{cfg.run.name}-{role}",
            time=job.time_min,
            nodes=job.nodes,
            ntasks_per_node=job.tasks_per_node,
            cpus_per_task=job.cpus_per_task,
            mem=f"{int(job.mem_gb * 1024)}M",
            signal_delay_s=ex.signal_delay_s,
            array_parallelism=job.array_parallelism or role_cfg.workers,
            setup=list(ex.setup),
            additional_parameters=dict(ex.extra_sbatch),
        )
        for key, value in (("partition", job.partition or ex.partition), ("account", ex.account), ("qos", ex.qos)):
            if value:
                params[key] = value
        if job.gpus_per_task:
            params["gpus_per_node"] = job.gpus_per_task
        slurm.update_parameters(**params)
        return slurm
    local = DetachedLocalExecutor(folder=folder, max_num_timeout=1000)
    local.update_parameters(timeout_min=job.time_min, signal_delay_s=30, tasks_per_node=job.tasks_per_node)
    return local


# ------------------------------------------------------------------ submit


def submit_role(rd: RunDir, cfg: Config, role: str, tasks: list[int]) -> dict[str, Any]:
    """Submit `tasks` of `role` as one job array; record and return the submission."""
    role_cfg = cfg.roles()[role]
    folder = rd.logs(role)
    folder.mkdir(parents=True, exist_ok=True)
    executor = make_executor(cfg, role, role_cfg, folder)
    fn = role_class(role)(str(rd.path))
    try:
        jobs = executor.map_array(fn, tasks)
    except Exception as e:  # submitit raises plain exceptions with sbatch's stderr
        raise SubmitError(f"{role}: submission failed: {e}") from None
    record: dict[str, Any] = {"role": role, "executor": cfg.executor.type, "tasks": tasks, "submitted_at": time.time()}
    # one id per task: `12_3` for array tasks, `12` when submitit submitted a
    # single task as a plain job, the controller's pid for local jobs
    record["job_ids"] = [j.job_id for j in jobs]
    if cfg.executor.type == "slurm":
        record["job_id"] = jobs[0].job_id.split("_")[0]
    rd.add_submission(role, record)
    return record


def submission_label(record: dict[str, Any]) -> str:
    ids = record["job_ids"]
    if record["executor"] == "slurm":
        return str(record["job_id"])
    if len(ids) == 1:
        return f"local pid {ids[0]}"
    # the pids are not a range (other processes start between them): list a few
    return "local pids " + ", ".join(ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")


# ------------------------------------------------------------------ query


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        raise SubmitError(f"{cmd[0]}: {e}") from None
    if out.returncode != 0:
        raise SubmitError(f"{' '.join(cmd[:2])}...: {out.stderr.strip()}")
    return out.stdout


def slurm_states(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """State of every array task of the given jobs: `{"12_3": {...}}`. squeue
    is authoritative for live tasks, sacct for finished ones."""
    if not job_ids:
        return {}
    ids = ",".join(job_ids)
    out: dict[str, dict[str, str]] = {}
    for line in _run(["sacct", "-X", "-n", "-P", "-j", ids, "-o", "JobID,State,ExitCode,Reason,NodeList"]).splitlines():
        jid, state, code, reason, node = (line.split("|") + [""] * 5)[:5]
        if "[" in jid:  # an unsplit pending array range: squeue expands it
            continue
        out[jid] = {
            "state": state.split()[0] if state else "UNKNOWN",
            "detail": _name_uid(state),
            "exit_code": code,
            "reason": reason,
            "node": node,
        }
    for line in _run(["squeue", "-h", "-r", "-j", ids, "-o", "%i|%T|%r|%N"]).splitlines():
        jid, state, reason, node = (line.split("|") + [""] * 4)[:4]
        out[jid] = {"state": state, "detail": state, "exit_code": "", "reason": reason, "node": node}
    return out


def _name_uid(state: str) -> str:
    """sacct says `CANCELLED by 1234`: name the user."""
    m = re.fullmatch(r"(\w+) by (\d+)", state)
    if not m:
        return state
    try:
        return f"{m[1]} by {pwd.getpwuid(int(m[2])).pw_name} (uid {m[2]})"
    except KeyError:
        return state


def _pid_is_controller(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"submitit.local._local" in cmdline


def local_state(rd: RunDir, record: dict[str, Any], index: int) -> dict[str, str]:
    job_id = record["job_ids"][index]
    if _pid_is_controller(int(job_id)):
        return {"state": "RUNNING", "detail": "RUNNING", "exit_code": "", "reason": "", "node": "localhost"}
    if record.get("cancelled_at"):
        return {
            "state": "CANCELLED",
            "detail": "CANCELLED by sarl cancel",
            "exit_code": "",
            "reason": "",
            "node": "localhost",
        }
    paths = JobPaths(rd.logs(record["role"]), job_id, 0)
    outcome = _result(paths.result_pickle)
    if outcome == "success":
        return {"state": "COMPLETED", "detail": "COMPLETED", "exit_code": "0", "reason": "", "node": "localhost"}
    if outcome is not None:
        return {"state": "FAILED", "detail": "FAILED", "exit_code": "", "reason": "", "node": "localhost"}
    return {
        "state": "DIED",
        "detail": "process ended without a result (killed?)",
        "exit_code": "",
        "reason": "",
        "node": "localhost",
    }


def _result(path: Path) -> str | None:
    """'success', the error text, or None when the job wrote no result."""
    try:
        with open(path, "rb") as f:
            kind, value = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, AttributeError, ModuleNotFoundError):
        return None
    return "success" if kind == "success" else str(value)


def failure_text(rd: RunDir, record: dict[str, Any], job_id: str) -> str:
    """The last line of the job's error: its exception, else its stderr."""
    paths = JobPaths(rd.logs(record["role"]), job_id, 0)
    outcome = _result(paths.result_pickle)
    lines: list[str] = []
    if outcome and outcome != "success":
        lines = [ln for ln in outcome.strip().splitlines() if ln.strip()]
    elif paths.stderr.exists():
        lines = [
            ln for ln in paths.stderr.read_text(errors="replace").splitlines() if ln.strip() and "submitit" not in ln
        ]
    return lines[-1].strip()[:300] if lines else ""


# ------------------------------------------------------------------ cancel


def cancel_submission(record: dict[str, Any]) -> None:
    if record["executor"] == "slurm":
        _run(["scancel", str(record["job_id"])])
        return
    _kill_controllers([int(p) for p in record["job_ids"]])


def cancel_tasks(record: dict[str, Any], tasks: list[int]) -> None:
    """Cancel some tasks of a submission: Slurm array tasks by id, local
    tasks by their controller."""
    ids = [record["job_ids"][record["tasks"].index(t)] for t in tasks]
    if record["executor"] == "slurm":
        _run(["scancel", *map(str, ids)])
        return
    _kill_controllers([int(p) for p in ids])


def _kill_controllers(candidates: list[int]) -> None:
    pids = [p for p in candidates if _pid_is_controller(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)  # the controller leads its own session and group
        deadline = time.time() + 5
        while sig == signal.SIGTERM and time.time() < deadline and any(_pid_is_controller(p) for p in pids):
            time.sleep(0.1)
