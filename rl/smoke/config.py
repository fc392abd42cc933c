"""The `[smoke]` role section (pydantic only)."""

from __future__ import annotations

from pydantic import Field

from rl.schema import SAFE, RoleConfig


class SmokeRole(RoleConfig):
    """A plumbing check: each task counts `steps` steps of `step_s` seconds,
    committing its progress to the run directory after every step. It
    exercises submission, status, preemption, requeue and resume on a cluster
    without any model."""

    workers: int = Field(8, ge=1, le=100_000)
    """Number of tasks in the smoke array."""
    steps: int = Field(10, ge=1)
    """Steps each task counts before it completes."""
    step_s: float = Field(1.0, ge=0, json_schema_extra=SAFE)
    """Seconds each step takes."""
    stall_tasks: list[int] = Field(default_factory=list, json_schema_extra=SAFE)
    """Tasks whose first start stalls half-way: the loop blocks for good
    while the heartbeat thread beats on (a deadlock), to check that recovery
    finds a task that runs but makes no progress (`run.recovery.stall_s`).
    A later start runs normally."""
    fail_tasks: list[int] = Field(default_factory=list, json_schema_extra=SAFE)
    """Tasks that raise an error half-way, to check how failures are reported
    (clear it with `sarl resume RUN_DIR --set smoke.fail_tasks=[]`)."""
