"""The `[run]`, `[executor]` and per-role `job` sections, the fields every
role shares, and the `[smoke]` role: what the run machinery itself reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from rl.schema import SAFE, TAG, Section, default_tag


class RunSection(Section):
    """Identity and location of the run."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    """Name of the run; its directory is `<root>/<name>`."""
    root: Path = Path("runs")
    """Folder that holds run directories, on the shared filesystem. A relative
    path is resolved against the directory `sarl submit` runs in."""
    seed: int = 0
    """Seed of every random choice of the run."""


class LocalExecutor(Section):
    """Run each job as a local process on this machine, through submitit."""

    type: Literal["local"] = "local"
    """Backend tag: `local` runs jobs as detached processes on this machine."""


class SlurmExecutor(Section):
    """Submit each role as a Slurm job or job array, through submitit."""

    type: Literal["slurm"] = "slurm"
    """Backend tag: `slurm` submits with sbatch."""
    partition: str | None = Field(None, json_schema_extra=SAFE)
    """Default partition of every role (a role's `job.partition` overrides it)."""
    account: str | None = Field(None, json_schema_extra=SAFE)
    """Slurm account to charge (`--account`)."""
    qos: str | None = Field(None, json_schema_extra=SAFE)
    """Quality of service (`--qos`)."""
    signal_delay_s: int = Field(120, ge=10, json_schema_extra=SAFE)
    """Seconds before the time limit at which Slurm sends USR2 so that a job can
    checkpoint and requeue itself. Slurm may send it up to about 60 s early."""
    max_timeouts: int = Field(1000, ge=0, json_schema_extra=SAFE)
    """How many times a job may hit its time limit and requeue itself before it
    counts as failed. Preemptions do not use this up."""
    setup: list[str] = Field(default_factory=list, json_schema_extra=SAFE)
    """Shell lines run at the start of every job script (e.g. `module load cuda`)."""
    extra_sbatch: dict[str, str | int | bool] = Field(default_factory=dict, json_schema_extra=SAFE)
    """Additional sbatch options, without the leading dashes (`{constraint = "a100"}`)."""


Executor = Annotated[LocalExecutor | SlurmExecutor, Field(discriminator=TAG), default_tag(LocalExecutor)]


class JobResources(Section):
    """What one task of a role asks the scheduler for."""

    partition: str | None = Field(None, json_schema_extra=SAFE)
    """Partition for this role; defaults to `executor.partition`."""
    time_min: int = Field(60, ge=1, json_schema_extra=SAFE)
    """Time limit of one job, in minutes. A role that reaches it checkpoints and
    requeues itself."""
    nodes: int = Field(1, ge=1, json_schema_extra=SAFE)
    """Nodes per task (multi-node only for the learner)."""
    cpus_per_task: int = Field(1, ge=1, json_schema_extra=SAFE)
    """CPU cores per task."""
    gpus_per_task: int = Field(0, ge=0, json_schema_extra=SAFE)
    """GPUs per task (`--gpus-per-node` on Slurm)."""
    mem_gb: float = Field(2.0, gt=0, json_schema_extra=SAFE)
    """Memory per task, in GiB."""
    array_parallelism: int | None = Field(None, ge=1, json_schema_extra=SAFE)
    """At most this many tasks of the array run at once (`--array=...%N`);
    none: no limit. The local executor enforces it with slot locks."""


class RoleConfig(Section):
    """Fields shared by every role."""

    tasks: int = Field(1, ge=1, le=100_000)
    """Number of tasks in the role's job array."""
    job: JobResources = JobResources()
    """Scheduler resources of each task."""


class SmokeRole(RoleConfig):
    """A plumbing check: each task counts `steps` steps of `step_s` seconds,
    committing its progress to the run directory after every step. It
    exercises submission, status, preemption, requeue and resume on a cluster
    without any model."""

    tasks: int = Field(8, ge=1, le=100_000)
    """Number of tasks in the smoke array."""
    steps: int = Field(10, ge=1)
    """Steps each task counts before it completes."""
    step_s: float = Field(1.0, ge=0, json_schema_extra=SAFE)
    """Seconds each step takes."""
    fail_tasks: list[int] = Field(default_factory=list, json_schema_extra=SAFE)
    """Tasks that raise an error half-way, to check how failures are reported
    (clear it with `sarl resume RUN_DIR --set smoke.fail_tasks=[]`)."""
