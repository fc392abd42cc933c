"""Per-sandbox cgroups, and the slots that name them.

A slot is a small integer, held through an flock on a node-local lock file
for as long as its sandbox lives; a process that dies releases it. The slot
gives the sandbox its uid inside (100000 + slot: `RLIMIT_NPROC` and file
ownership are then per sandbox) and the name of its cgroups. The cgroups of
a slot are reused from one sandbox to the next (creating them costs more
than a sandbox start); whoever takes a slot first kills whatever a dead
predecessor left in them, so a crashed worker leaves no process behind once
its successor starts. `sweep()` removes the cgroups of free slots.

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
        raise RuntimeError(f"all {MAX_SLOTS} sandbox slots of this node are taken")


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
        mem = limits.memory_mb << 20
        (dirs["memory"] / "memory.limit_in_bytes").write_text(str(mem))
        with contextlib.suppress(OSError):  # no swap accounting on many kernels
            (dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(mem))
        (dirs["pids"] / "pids.max").write_text(str(limits.processes))
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
            (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(limits.memory_mb << 20))
            (self.dirs["pids"] / "pids.max").write_text(str(limits.processes))
        else:
            (self.dirs["all"] / "memory.max").write_text(str(limits.memory_mb << 20))
            (self.dirs["all"] / "pids.max").write_text(str(limits.processes))

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError):
                out |= {int(x) for x in Path(f).read_text().split()}
        return sorted(out)

    def kill_all(self) -> None:
        """Kill every process in the cgroups; frozen first so that none can fork meanwhile."""
        if not self.pids():
            return
        freezer = self.dirs.get("freezer")
        if self.kind == "v1" and freezer is not None and freezer.is_dir():
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
        elif self.kind == "v2":
            with contextlib.suppress(OSError):
                (self.dirs["all"] / "cgroup.kill").write_text("1")
        for _ in range(100):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        if self.kind == "v1" and freezer is not None and freezer.is_dir():
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("THAWED")

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


def sweep() -> list[int]:
    """Remove the cgroups of every slot that no live process holds; return those slots."""
    freed: list[int] = []
    if not SLOT_DIR.is_dir():
        return freed
    held = []
    try:
        for lock in sorted(SLOT_DIR.glob("slot-*.lock")):
            f = open(lock, "ab")  # noqa: SIM115
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            held.append(f)
            n = int(lock.stem.split("-")[1])
            for kind_dirs in ({ctl: V1 / ctl / "sarl" / f"sb{n}" for ctl in ("memory", "pids", "cpuacct", "freezer")},):
                cg = Cgroups("v1", kind_dirs)
                if any(d.exists() for d in kind_dirs.values()):
                    cg.destroy()
                    freed.append(n)
    finally:
        for f in held:
            f.close()
    return freed
