"""What every sandbox backend returns and raises."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class SandboxError(RuntimeError):
    """A sandbox could not be created or stopped answering."""


class SandboxDied(SandboxError):
    """The sandbox's resident died (or was killed by the code it ran): replace the sandbox."""


class SandboxLost(SandboxDied):
    """The sandbox was dead before a request reached it: nothing of the
    request ran, so running it again on a fresh sandbox is safe and tells
    nothing about the request (a verification is retried, never scored)."""


@dataclass
class ExecResult:
    """The outcome of one command or snippet."""

    exit_code: int | None
    """Exit status; negative for a signal; None if it never finished (killed on a limit)."""
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    limit: str | None = None
    """The limit that killed it: wall_time, cpu_time, memory, processes, disk, output; None if none."""
    signal: int | None = None
    duration_s: float = 0.0
    cpu_s: float | None = None
    enforced: dict[str, str] = field(default_factory=dict)
    """How each limit was enforced here: cgroup, rlimit, tmpfs, resident."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["stdout"] = self.stdout.decode(errors="replace")
        d["stderr"] = self.stderr.decode(errors="replace")
        return d
