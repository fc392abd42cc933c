"""What a role's loop gets besides its own section: the run context.

Every role's loop is `run(ctx, cfg)`: `cfg` is the role's own typed section
(values it needs from another role were copied into it when the config
was validated, by rl.config), and `ctx` is this small record of the run it
belongs to. The run machinery (rl.run.role) builds it when a task starts;
tests and benchmarks build one with `rl.run.role.context_of`.

Besides its own section a loop reads the run-wide sections that describe
where it runs (the base model, the sandboxes, the verifier), never another
role's.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rl.layout import RunLayout
from rl.model import ModelConfig
from rl.verify.config import VerifyConfig
from sandboxes.config import SandboxConfig


def _nothing(**changes: Any) -> None:
    return None


def _never() -> None:
    return None


@dataclass
class RunContext:
    """One task of a role, in its run."""

    run_dir: Path
    task: int
    """This task's index in its role's array."""
    seed: int
    """`run.seed`: every random choice of the run derives from it."""
    mode: Literal["async", "sync"]
    """`run.mode`."""
    max_staleness: int
    """The staleness bound in force (`run.max_staleness`; 0 in sync mode)."""
    model: ModelConfig
    """The base policy (`[model]`)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Where model-written code runs (`[sandbox]`)."""
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    """How rewards are made (`[verify]`)."""
    roles: frozenset[str] = frozenset()
    """The roles the run has (`learner` in it: there is a learner to wait for)."""
    rank: int = 0
    """This process's rank among its task's processes (the learner's ranks)."""
    job_id: str = ""
    """The scheduler's id of this task (`123_4`), or `pid-N` for a local process."""
    committed: Callable[[], dict[str, Any]] = dict
    """The task's last committed state (`state`)."""
    save: Callable[..., None] = _nothing
    """Commit the task's state with these changes (atomically; a commit is progress)."""
    beat: Callable[..., None] = _nothing
    """A sign of life with extra fields for `sarl status` (`inflight=3`)."""
    progressed: Callable[[], None] = _never
    """The loop advanced, or waits on another role: not stalled (rl.run.recovery)."""
    done: Callable[[str], bool] = lambda role: False
    """Every task of that role has finished (False when the run has no such role)."""
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set on USR2 (preemption, time limit): end soon, the task is requeued."""
    usr2: list[Callable[[], None]] = field(default_factory=list)
    """What to do on USR2 before the task is requeued (flush, checkpoint), in order."""

    @property
    def state(self) -> dict[str, Any]:
        """The task's last committed state (empty at its first start): what
        it had done before it was killed, requeued or preempted."""
        return self.committed()

    @property
    def sync(self) -> bool:
        return self.mode == "sync"

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    def on_usr2(self, fn: Callable[[], None]) -> None:
        """Run `fn` from the USR2 handler (on the main thread), after `stopping` is set."""
        self.usr2.append(fn)


@contextlib.contextmanager
def usr2_held() -> Iterator[None]:
    """A section that a USR2 (preemption, time limit) must not interrupt: one
    arriving inside is answered when the section ends, on the main thread,
    by the handler installed before (submitit's: checkpoint, requeue, exit).
    For work whose state is not whole until it ends (the learner's step: the
    weights change before their step is counted), which the handler cannot
    wait for on the thread it interrupts. The answer comes up to the
    section's length late. Off the main thread, or under no Python handler,
    the section holds nothing."""
    before = signal.getsignal(signal.SIGUSR2)
    if threading.current_thread() is not threading.main_thread() or not callable(before):
        yield
        return
    arrived: list[int] = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR2, before)
        if arrived:
            before(signal.SIGUSR2, None)
