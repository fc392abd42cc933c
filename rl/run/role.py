"""What every role has in common: a checkpointable callable, one task of a job
array, whose state lives in the run directory.

A role is registered once (rl.config.ROLES) with its config section and a
thin Role subclass in `jobs/`, whose `run(ctx, cfg)` hands over to the
role's loop in `rl/<role>/loop.py`. The loop gets a run context
(rl.context.RunContext: run directory, seed, mode, model, state and the
callbacks below) and its own typed section, nothing else.

A role object is pickled by submitit and unpickled in the job. It carries only
the run directory's path; everything else (config, progress) is read from
the run directory when the task starts, so a task that is killed at any
instant and started again continues from its last committed state.

State is committed with `commit()` (the loop's `ctx.save`), an atomic
replace of one JSON file per task. On USR2 (time limit near, or preemption)
submitit calls `checkpoint()` from a signal handler: it sets `ctx.stopping`,
runs what the loop registered with `ctx.on_usr2` (commit what can be
committed), writes the last committed state once more with the event
recorded, and asks submitit to requeue the same task.

A role also tells generic recovery (rl.run.recovery) what it needs through
class-level hooks (`restart_also`, `before_restart`, `on_given_up`), so that
recovery knows no role by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import submitit

from rl.config import Config, LocalExecutor, RoleConfig
from rl.context import RunContext
from rl.fsio import read_json, write_json
from rl.layout import RunLayout
from rl.run.heartbeat import Beat
from rl.run.recovery import Watcher
from rl.run.rundir import RunDir


def current_job_id() -> str:
    """The scheduler's id of this task (`123_4` for an array task), or the pid."""
    try:
        return str(submitit.JobEnvironment().job_id)
    except RuntimeError:
        return f"pid-{os.getpid()}"


START_MARK = "sarl: start "
"""The line a task's start writes to its stdout and stderr: `sarl logs` cuts
submitit's files (which a Slurm requeue appends to) into attempts by it."""


def announce_start(role: str, task: int, n: int, start: dict[str, Any]) -> None:
    where = f"job {start['job_id']} on {start['host']}, from {start['from'] or 'the beginning'}"
    line = f"{START_MARK}{role}/{task} #{n} ({where})"
    for stream in (sys.stdout, sys.stderr):
        print(line, file=stream, flush=True)


def current_rank() -> int:
    """This process's rank among the processes of its task (0 when alone)."""
    try:
        return int(submitit.JobEnvironment().global_rank)
    except RuntimeError:
        return 0


def pin_to_cores(cpus: list[int]) -> None:
    """Run this process, and every process it starts, on `cpus` alone, with
    as many compute threads as cores. Called before the role imports torch
    or starts an engine, which read these at start. vLLM would otherwise
    bind its threads to cores of its own choosing, outside the pin."""
    os.sched_setaffinity(0, cpus)
    n = str(len(cpus))
    os.environ.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") == "auto":
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus))


def context_of(
    cfg: Config, run_dir: Any, task: int = 0, state: dict[str, Any] | None = None, **callbacks: Any
) -> RunContext:
    """The run context of one task of a run (`callbacks`: save, beat,
    progressed, done); a role's task gets it from `Role`, tests and
    benchmarks that drive a loop directly from here."""
    rd = RunDir(run_dir)
    done = callbacks.pop("done", lambda role: rd.exists() and rd.all_done(role))
    if "committed" not in callbacks:  # a loop driven directly: its commits go to this dict
        kept = state if state is not None else {}
        callbacks["committed"] = lambda: kept
        callbacks.setdefault("save", lambda **changes: kept.update(changes))
    return RunContext(
        run_dir=rd.path,
        task=task,
        seed=cfg.run.seed,
        mode=cfg.run.mode,
        max_staleness=cfg.run.staleness(),
        model=cfg.model,
        sandbox=cfg.sandbox,
        verify=cfg.verify,
        roles=frozenset(cfg.roles()),
        job_id=current_job_id(),
        done=done,
        **callbacks,
    )


class Role(submitit.helpers.Checkpointable):
    """Base of the roles. Subclasses implement `run(ctx, cfg)` (hand over to
    the role's loop), and may say how far a task got (`progress`) and what
    its first state holds (`initial_state`); `self.state` is the last
    committed state.

    A task of several processes (the learner's ranks) has one state: rank 0
    commits it and beats; the other ranks keep theirs in memory only."""

    name: str = "role"

    def __init__(self, run_dir: str):
        self.run_dir = str(run_dir)
        self.state: dict[str, Any] = {}
        self.task = -1
        self.rank = 0
        self._beat_info: dict[str, Any] = {}
        self._progress_at = time.time()
        """When the task's main loop last advanced or waited on another role
        (`progressed()`): the heartbeat carries it, and recovery finds a task
        whose beat is fresh but whose loop stands still (rl.run.recovery)."""
        self.ctx: RunContext | None = None

    # ------------------------------------------------------------ lifecycle
    def __call__(self, task: int) -> dict[str, Any]:
        self.task = task
        self.rank = current_rank()
        rd = RunDir(self.run_dir)
        cfg = rd.config()
        role_cfg = cfg.roles()[self.name]
        if role_cfg.job.cpu_list is not None:  # validated: the local executor, cores that exist
            pin_to_cores(role_cfg.job.cpu_list)
        self._progress_at = time.time()  # the clock of `run.recovery.stall_s` covers the start-up too
        with self._local_slot(cfg, role_cfg):
            self.state = read_json(rd.state_path(self.name, task)) or self.initial_state(role_cfg)
            if self.state.get("done"):
                return self.state.get("result", {})
            start = {
                "job_id": current_job_id(),
                "host": socket.gethostname(),
                "at": time.time(),
                "from": self.progress(),
                "cpus": sorted(os.sched_getaffinity(0)),  # the cores it may run on (job.cpu_list)
            }
            self.commit(starts=[*self.state.get("starts", []), start])
            announce_start(self.name, task, len(self.state["starts"]), start)
            self.ctx = context_of(cfg, rd.path, task, rank=self.rank, committed=lambda: self.state)
            self.ctx.save, self.ctx.beat, self.ctx.progressed = self.commit, self.beat, self.progressed
            with self._recovering(cfg):
                result = self.run(self.ctx, role_cfg)
            self.commit(done=True, result=result)
            return result

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on USR2: stop the loop and make its work
        durable (what it registered with `ctx.on_usr2`), save the state,
        then requeue this task."""
        if self.ctx is not None:
            self.ctx.stopping.set()
            for fn in self.ctx.usr2:
                fn()
        if self.task >= 0 and self.state:
            self.commit(checkpoints=self.state.get("checkpoints", 0) + 1)
        return super().checkpoint(*args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        """What submitit pickles, at submission and into a requeue: the run
        directory alone. Whatever a running role holds (a worker, a trainer)
        is rebuilt from the run directory when the task starts again."""
        return {"run_dir": self.run_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["run_dir"])  # type: ignore[misc]

    # --------------------------------------------------------------- hooks
    def initial_state(self, role_cfg: Any) -> dict[str, Any]:
        """The state of a task that never committed one."""
        return {"task": self.task, "done": False, "starts": [], "checkpoints": 0}

    def run(self, ctx: RunContext, cfg: Any) -> dict[str, Any]:
        """The task's work: the role's loop on its own section `cfg`."""
        raise NotImplementedError

    def progress(self) -> str:
        """A short human-readable progress string, shown by `sarl status`."""
        return ""

    # ------------------------------------------------------ recovery hooks
    # Called by the recovery round (rl.run.recovery), in a process of its
    # own, with the run directory's layout; the defaults do nothing.

    @staticmethod
    def restart_also(rd: RunLayout, tasks: int) -> list[tuple[int, str]]:
        """Tasks of this role to start again although they did not die, with
        why (a rollout worker that ended before a share was handed to it)."""
        return []

    @staticmethod
    def before_restart(rd: RunLayout, task: int) -> None:
        """Make a task that `restart_also` named ready to start again."""

    @staticmethod
    def on_given_up(rd: RunLayout, task: int, tasks: int, running: set[int], given_up: set[int]) -> dict[str, Any]:
        """`task` died in a loop and is given up: take care of its work
        (`running`: this role's live tasks; `given_up`: those given up,
        `task` among them). Returns what to add to its recovery record."""
        return {}

    # ---------------------------------------------------------------- state
    def progressed(self) -> None:
        """The main loop advanced (a step, an episode, a batch) or waits on
        another role (the staleness gate, batches not committed yet). Called
        from the loop itself, never from the beat thread: a loop that
        deadlocks stops calling it while the beat goes on."""
        self._progress_at = time.time()

    def commit(self, **changes: Any) -> None:
        """Atomically persist the state with `changes` applied, then beat.
        A commit is progress."""
        # Assign before writing: a signal handler that runs between the two
        # then checkpoints the new state, never the one before it.
        self.state = {**self.state, **changes, "updated_at": time.time()}
        self.progressed()
        if self.rank != 0:
            return
        write_json(RunDir(self.run_dir).state_path(self.name, self.task), self.state)
        self.beat()

    def beat(self, **info: Any) -> None:
        """Record a sign of life: when, where, which job, how far."""
        if self.rank != 0:
            return
        self._beat_info = info
        rd = RunDir(self.run_dir)
        write_json(
            rd.heartbeat_path(self.name, self.task),
            {
                "at": time.time(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "job_id": current_job_id(),
                "progress": self.progress(),
                "progress_at": self._progress_at,
                **info,
            },
        )

    def rebeat(self) -> None:
        """The last beat again, with the time of now (rl.run.heartbeat.Beat)."""
        self.beat(**self._beat_info)

    @contextlib.contextmanager
    def _recovering(self, cfg: Config) -> Iterator[None]:
        """While the task runs: its beat thread, and on task 0 the watcher."""
        rc = cfg.run.recovery
        if not rc.enabled or self.rank != 0:
            yield
            return
        threads: list[Beat | Watcher] = [Beat(self.rebeat, rc.beat_s)]
        if self.task == 0:
            threads.append(Watcher(self.run_dir, rc.check_s))
        for t in threads:
            t.start()
        try:
            yield
        finally:
            for t in threads:
                t.stop.set()

    # --------------------------------------------------- local parallelism
    @contextlib.contextmanager
    def _local_slot(self, cfg: Config, role_cfg: RoleConfig) -> Any:
        """Under the local executor, hold one of `array_parallelism` slot
        locks while running (Slurm enforces `%N` itself). The lock dies with
        the process, so a killed task frees its slot."""
        limit = role_cfg.job.array_parallelism
        if not isinstance(cfg.executor, LocalExecutor) or limit is None or self.rank != 0:
            yield
            return
        folder = RunLayout(self.run_dir).logs(self.name) / "slots"
        folder.mkdir(parents=True, exist_ok=True)
        while True:
            for k in range(limit):
                f = open(folder / f"slot-{k}.lock", "a")  # noqa: SIM115 (held until the task ends)
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                try:
                    yield
                finally:
                    f.close()
                return
            self.progressed()  # waiting for a slot is not a stall
            self.beat(waiting="for a local slot")
            time.sleep(0.5)
