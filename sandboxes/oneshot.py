"""One-shot runs: one command in a fresh bubblewrap sandbox, cold (no resident).

Every process of the sandbox dies with the command: bubblewrap's init exits
and the kernel kills the rest of the pid namespace. Limits are watched from
here: the sandbox's cgroup counters, output size and wall time; and, when
started as root, /sandbox and /tmp are tmpfs mounted by this process, so that
a full disk can still be told after the command has exited.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from sandboxes import resident
from sandboxes.base import ExecResult, SandboxError
from sandboxes.cgroups import Cgroups, Slot
from sandboxes.config import Limits, SandboxConfig
from sandboxes.isolation import BwrapCommand, Runtime, bwrap_argv, enforced_limits, entered, rlimits_of, seccomp_pipe
from sandboxes.spawn import spawn


def run_once(
    argv: list[str], cfg: SandboxConfig | None = None, stdin: bytes = b"", files: dict[str, bytes] | None = None
) -> ExecResult:
    """Run one command in a fresh sandbox, cold (no resident). Every process of the
    sandbox dies with the command: bubblewrap's init exits and the kernel kills
    the rest of the pid namespace. `files` are written into /sandbox first."""
    cfg = cfg or SandboxConfig()
    if cfg.network:
        raise SandboxError("a network allow-list needs a persistent sandbox (open_sandbox), not a one-shot run")
    limits = cfg.limits
    runtime = Runtime(cfg.runtime, cfg.packages)
    slot = Slot.acquire()
    cg = Cgroups.create(slot.name, limits)
    rl = rlimits_of(limits, cg)
    scratch = _HostScratch.create(slot, limits)
    try:
        filt = seccomp_pipe()
        cmd = bwrap_argv(
            limits, slot, runtime, cg, with_resident=False, host_dirs=scratch.dirs if scratch else None, seccomp_fd=filt
        )
        if files:
            for name, data in files.items():
                if scratch:
                    target = Path(scratch.dirs[resident.WORK]) / name
                    target.write_bytes(data)
                    os.chown(target, slot.uid, slot.uid)
            if not scratch:  # bubblewrap copies them in from pipes
                return _run_with_files(cmd, argv, files, stdin, rl, slot, cg, None, filt)
        fds = [filt] if filt is not None else []
        return _run(cmd.argv(argv, fds), stdin, rl, slot, cg, fds, scratch)
    finally:
        if scratch is not None:
            scratch.remove()
        if cg is not None:
            cg.kill_all()
        slot.release()


class _HostScratch:
    """/sandbox and /tmp of a one-shot sandbox as tmpfs mounted by the host (root
    only), so that the host can still tell a full disk after the command ended."""

    def __init__(self, base: Path):
        self.base = base
        self.dirs = {resident.WORK: str(base / "work"), "/tmp": str(base / "tmp")}

    @classmethod
    def create(cls, slot: Slot, limits: Limits) -> _HostScratch | None:
        if os.geteuid() != 0:
            return None
        from sandboxes.cgroups import SLOT_DIR

        self = cls(SLOT_DIR / f"{slot.name}-scratch")
        self.remove()
        try:
            for d in self.dirs.values():
                os.makedirs(d, exist_ok=True)
                _libc_call(
                    "mount",
                    b"tmpfs",
                    d.encode(),
                    b"tmpfs",
                    _MS_NOSUID | _MS_NODEV,
                    f"size={limits.disk_mb}m,mode=1777".encode(),
                )
        except OSError:
            self.remove()
            return None
        return self

    def remove(self) -> None:
        for d in self.dirs.values():
            with contextlib.suppress(OSError):
                _libc_call("umount2", d.encode(), _MNT_DETACH)
        shutil.rmtree(self.base, ignore_errors=True)


_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2


def _libc_call(name: str, *args: Any) -> None:
    """mount(2) / umount2(2) without spawning mount(8): a process start costs more than the sandbox."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _run_with_files(
    cmd: BwrapCommand,
    argv: list[str],
    files: dict[str, bytes],
    stdin: bytes,
    rl: dict[str, Any],
    slot: Slot,
    cg: Cgroups | None,
    scratch: _HostScratch | None,
    filt: int | None,
) -> ExecResult:
    pass_fds = [filt] if filt is not None else []
    extra = []
    for name, data in files.items():
        r, w = os.pipe()
        pass_fds.append(r)
        os.set_inheritable(r, True)
        threading.Thread(target=_feed, args=(w, data), daemon=True).start()  # without blocking this one
        extra += ["--perms", "0644", "--file", str(r), f"{resident.WORK}/{name}"]
    idx = cmd.options.index("--chdir")
    cmd.options[idx:idx] = extra
    return _run(cmd.argv(argv, pass_fds), stdin, rl, slot, cg, pass_fds, scratch)


def _feed(fd: int, data: bytes) -> None:
    """Write `data` into a pipe bubblewrap reads a file from, then close it
    (a bubblewrap that never reads it ends the write with EPIPE)."""
    with contextlib.suppress(OSError):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    os.close(fd)


def _run(
    full: list[str],
    stdin: bytes,
    rl: dict[str, Any],
    slot: Slot,
    cg: Cgroups | None,
    pass_fds: list[int],
    scratch: _HostScratch | None,
) -> ExecResult:
    t0 = time.monotonic()
    proc = spawn(  # see sandboxes/spawn.py: bubblewrap's --die-with-parent follows the thread
        entered(full, slot, cg, rl),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
    )
    for fd in pass_fds:
        os.close(fd)
    watch = _HostWatch(cg, rl, proc.pid, scratch) if cg is not None else resident.Watch("/nonexistent", rl)
    assert proc.stdin and proc.stdout and proc.stderr
    stdin_fd = os.dup(proc.stdin.fileno())
    proc.stdin.close()
    status, out, err, trunc, limit = resident.collect(
        proc.pid, [proc.stdout.fileno(), proc.stderr.fileno()], rl, watch, (), stdin=stdin, stdin_fd=stdin_fd
    )
    if limit is not None or status is None:
        if cg is not None:
            cg.kill_all()
        else:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if status is None:
            _, status = os.waitpid(proc.pid, 0)
    proc.returncode = 0  # reaped above; keeps Popen from waiting again
    proc.stdout.close()
    proc.stderr.close()
    code, sig = resident.describe(status)
    if sig is None and code is not None and code > 128:  # bwrap exits 128+N for a command killed by signal N
        sig = code - 128
    if limit is None and code != 0 and watch.memory_hit():
        limit = "memory"  # the OOM killer took it
    if limit is None and sig == 24:  # SIGXCPU: the CPU-time rlimit
        limit = "cpu_time"
    return ExecResult(
        exit_code=None if limit else code,
        stdout=out,
        stderr=err,
        stdout_truncated=trunc[0],
        stderr_truncated=trunc[1],
        limit=limit,
        signal=sig,
        duration_s=time.monotonic() - t0,
        cpu_s=watch.cpu_s(),
        enforced=enforced_limits(cg),
    )


class _HostWatch(resident.Watch):
    """The resident's Watch, reading the cgroup files where they are on the host."""

    def __init__(self, cg: Cgroups, limits: dict[str, Any], outer_pid: int, scratch: _HostScratch | None):
        self.files = cg.counter_files()
        self.scratch = scratch
        self.cgroups = cg
        self.outer_pid = outer_pid
        super().__init__("", limits)

    def disk_paths(self, default: Any) -> list[str]:
        """The sandbox's tmpfs: host-mounted, or seen through a process inside it (not bwrap's outer one)."""
        if self.scratch is not None:
            return list(self.scratch.dirs.values())
        for pid in self.cgroups.pids():
            if pid != self.outer_pid:
                return [f"/proc/{pid}/root{resident.WORK}", f"/proc/{pid}/root/tmp"]
        return []

    def _read(self, name: str) -> str | None:
        path = self.files.get(name)
        if path is None:
            return None
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None
