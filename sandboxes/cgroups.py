"""Per-sandbox cgroups, and the slots that name them.

A slot is a small integer, held through an flock on a node-local lock file
for as long as its sandbox lives; a process that dies releases it. The slot
gives the sandbox its uid inside (100000 + slot: `RLIMIT_NPROC` and file
ownership are then per sandbox) and the name of its cgroups. The cgroups of
a slot are reused from one sandbox to the next (creating them costs more
than a sandbox start); whoever takes a slot first kills whatever a dead
predecessor left in them, so a crashed worker leaves no process behind once
its successor starts.

cgroup v1 (memory, pids, cpuacct, freezer controllers under `sarl/<slot>`)
and v2 (a `sarl-<slot>` child of this process's cgroup, where its
controllers are delegated). Where neither is writable, `create` returns
None and the sandbox falls back to rlimits, saying so in its results.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import IO

from sandboxes.base import SandboxError
from sandboxes.config import Limits

V1 = Path("/sys/fs/cgroup")
SLOT_DIR = Path(os.environ.get("SARL_SANDBOX_SLOTS", Path(tempfile.gettempdir()) / f"sarl-sandbox-slots-{os.getuid()}"))
MAX_SLOTS = 4096


class Slot:
    """An exclusive sandbox slot on this node."""

    def __init__(self, n: int, lock: IO[bytes]):
        self.n = n
        self._lock = lock

    @property
    def uid(self) -> int:
        return 100000 + self.n

    @property
    def name(self) -> str:
        return f"sb{self.n}"

    def release(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._lock.close()

    @classmethod
    def acquire(cls) -> Slot:
        SLOT_DIR.mkdir(parents=True, exist_ok=True)
        for n in range(MAX_SLOTS):
            f = open(SLOT_DIR / f"slot-{n}.lock", "ab")  # noqa: SIM115 (held while the sandbox lives)
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            return cls(n, f)
        raise SandboxError(f"all {MAX_SLOTS} sandbox slots of this node are taken (locks in {SLOT_DIR})")


class Cgroups:
    """The cgroups of one sandbox."""

    def __init__(self, kind: str, dirs: dict[str, Path]):
        self.kind = kind
        self.dirs = dirs  # controller -> folder (v2: one folder under "all")

    @property
    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def counter_files(self) -> dict[str, str]:
        """Files the agent reads to tell which limit fired (bound read-only into the sandbox)."""
        names = {
            "v1": [
                ("pids", "pids.events"),
                ("memory", "memory.oom_control"),
                ("memory", "memory.failcnt"),
                ("cpuacct", "cpuacct.usage"),
            ],
            "v2": [("all", "pids.events"), ("all", "memory.events"), ("all", "cpu.stat")],
        }[self.kind]
        out = {}
        for ctl, name in names:
            path = self.dirs[ctl] / name
            if path.exists():
                out[name] = str(path)
        return out

    def enforced(self) -> dict[str, str]:
        return {"memory": f"cgroup {self.kind}", "processes": f"cgroup {self.kind}", "cpu_time": f"cgroup {self.kind}"}

    # -------------------------------------------------------------- lifecycle
    @classmethod
    def create(cls, name: str, limits: Limits) -> Cgroups | None:
        try:
            if (V1 / "memory" / "memory.limit_in_bytes").exists() or (V1 / "memory").is_dir():
                return cls._create_v1(name, limits)
            if (V1 / "cgroup.controllers").exists():
                return cls._create_v2(name, limits)
        except OSError:
            return None
        return None

    @classmethod
    def _create_v1(cls, name: str, limits: Limits) -> Cgroups:
        dirs = {ctl: V1 / ctl / "sarl" / name for ctl in ("memory", "pids", "cpuacct", "freezer")}
        cg = cls("v1", dirs)
        if all(d.is_dir() for d in dirs.values()):
            cg.kill_all()  # the slot's cgroups are reused; kill what a dead predecessor left in them
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        cg.set_limits(limits)
        return cg

    @classmethod
    def _create_v2(cls, name: str, limits: Limits) -> Cgroups:
        own = Path(open("/proc/self/cgroup").read().strip().split("::", 1)[1])  # noqa: SIM115
        d = V1 / own.relative_to("/") / f"sarl-{name}"
        cg = cls("v2", {"all": d})
        cg.destroy()
        d.mkdir()
        (d / "memory.max").write_text(str(limits.memory_mb << 20))
        with contextlib.suppress(OSError):
            (d / "memory.swap.max").write_text("0")
        (d / "pids.max").write_text(str(limits.processes))
        return cg

    def set_limits(self, limits: Limits) -> None:
        if self.kind == "v1":
            mem = self.dirs["memory"]
            new = limits.memory_mb << 20
            files = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
            if new > int((mem / "memory.limit_in_bytes").read_text()):
                files.reverse()  # the swap limit may never be below the memory limit
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    (mem / name).write_text(str(new))
            (self.dirs["pids"] / "pids.max").write_text(str(limits.processes))
        else:
            (self.dirs["all"] / "memory.max").write_text(str(limits.memory_mb << 20))
            (self.dirs["all"] / "pids.max").write_text(str(limits.processes))

    def pids(self) -> list[int]:
        """Live processes in the cgroups (zombies, already dead, are left to their parent to reap)."""
        out: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError):
                out |= {int(x) for x in Path(f).read_text().split()}
        return sorted(p for p in out if not _zombie(p))

    def kill_all(self) -> None:
        """Kill every process in the cgroups: frozen first so that none can fork
        meanwhile, signalled, then thawed (a frozen process dies only once thawed)."""
        if not self.pids():
            return
        if self.kind == "v2":
            with contextlib.suppress(OSError):
                (self.dirs["all"] / "cgroup.kill").write_text("1")
        freezer = self.dirs.get("freezer") if self.kind == "v1" else None
        for _ in range(200):
            if freezer is not None:
                with contextlib.suppress(OSError):
                    (freezer / "freezer.state").write_text("FROZEN")
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if freezer is not None:
                with contextlib.suppress(OSError):
                    (freezer / "freezer.state").write_text("THAWED")
            if not pids:
                return
            time.sleep(0.001)

    def destroy(self) -> None:
        """Kill what is left and remove the cgroups (idempotent)."""
        if not any(d.exists() for d in self.dirs.values()):
            return
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy: a process is still exiting
                    time.sleep(0.01)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone
    return stat[stat.rindex(")") + 2] == "Z"
