"""Per-sandbox cgroups, and the slots that name them.

A slot is a small integer, held through an flock on a node-local lock file
for as long as its sandbox lives; a process that dies releases it. The slot
gives the sandbox its uid inside (100000 + slot: `RLIMIT_NPROC` and file
ownership are then per sandbox) and the name of its cgroups. The cgroups of
a slot are reused from one sandbox to the next (creating them costs more
than a sandbox start); whoever takes a slot first kills whatever a dead
predecessor left in them, so a crashed worker leaves no process behind once
its successor starts.

Sandbox cgroups are children of this process's own cgroup, in v1 (memory,
pids, cpuacct, freezer: `<own>/sarl/<slot>` per controller) and v2 (a
`sarl-<slot>` child, where the controllers are delegated): a Slurm job's
memory limit covers its sandboxes, and a node cannot be driven out of memory
past the job's allocation. Where neither is writable, `create` returns None
and the sandbox falls back to rlimits, saying so in its results
(`enforced`, which also names the cgroup that governed).

The slot folder holds the lock files and per-slot scratch. It must belong to
this user and be writable by nobody else: a folder that another local user
made first (with a symlink for a slot's scratch, or lock files to `flock`)
is refused. Root uses /run/sarl-sandbox; others `$XDG_RUNTIME_DIR` or
/tmp/sarl-sandbox-slots-UID, mode 0700.
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


def _default_slot_dir() -> Path:
    if "SARL_SANDBOX_SLOTS" in os.environ:
        return Path(os.environ["SARL_SANDBOX_SLOTS"])
    if os.geteuid() == 0:
        return Path("/run/sarl-sandbox")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "sarl-sandbox"
    return Path(tempfile.gettempdir()) / f"sarl-sandbox-slots-{os.getuid()}"


SLOT_DIR = _default_slot_dir()
SLOTS = range(4096)
"""The slot numbers a sandbox may take. A slot's uid and cgroup name are the
node's, not the slot folder's: as root, slot 3 of any folder is uid 100003,
and taking it kills that uid's processes. So root also locks the uid itself,
in UID_LOCK_DIR."""
UID_LOCK_DIR = Path("/run/sarl-sandbox-uids")
"""As root, one lock file a sandbox uid, in one folder a node, whatever slot
folder a worker uses (`SARL_SANDBOX_SLOTS`): two workers with different slot
folders would otherwise hand out one uid twice, and each would kill the
other's sandboxes. Not covered: without root, two workers of one user in one
cgroup with different slot folders still share cgroup names (`sb<n>`); their
uids are their own user namespaces'."""
CONTROLLERS = ("memory", "pids", "cpuacct", "freezer")
KILL_WAIT_S = 10.0
"""How long killing a sandbox's processes waits for them to leave its cgroups."""


def private_dir(path: Path) -> Path:
    """`path` as a folder of this user's that nobody else can write (made 0700
    if missing); a SandboxError if it is a symlink, another user's, or
    writable by group or others."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = os.lstat(path)
    import stat

    if not stat.S_ISDIR(st.st_mode):
        raise SandboxError(f"{path}: expected a folder, found something else (a symlink?); refusing to use it")
    if st.st_uid != os.geteuid():
        raise SandboxError(f"{path} belongs to uid {st.st_uid}, not to this user; refusing to use it")
    if st.st_mode & 0o022:
        raise SandboxError(f"{path} is writable by other users (mode {oct(st.st_mode & 0o777)}); refusing to use it")
    return path


def _uid_live_pids(uid: int) -> list[int]:
    """The processes of `uid` that have not exited yet (zombies left out)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            if Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        out.append(int(name))
    return out


def kill_uid(uid: int, wait_s: float = 0.0) -> int:
    """SIGKILL every process of `uid` (a slot's sandbox uid: only its
    sandboxes run as it), and wait up to `wait_s` until none is alive.
    What a dead predecessor on the slot left behind dies, wherever its
    cgroup was. Why the wait: a killed process leaves its cgroup before it
    has finished exiting, so an empty cgroup does not yet mean no process."""
    killed: set[int] = set()
    deadline = time.monotonic() + wait_s
    while True:
        pids = _uid_live_pids(uid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        if not pids or time.monotonic() >= deadline:
            return len(killed)
        time.sleep(0.005)


class Slot:
    """An exclusive sandbox slot on this node."""

    def __init__(self, n: int, locks: list[IO[bytes]]):
        self.n = n
        self._locks = locks

    @property
    def uid(self) -> int:
        return 100000 + self.n

    @property
    def name(self) -> str:
        return f"sb{self.n}"

    def release(self) -> None:
        """Free the slot once none of its processes is alive (as root: its uid
        is this slot's alone), so that a sandbox's close() leaves nothing behind."""
        if os.geteuid() == 0 and not self._locks[0].closed:
            kill_uid(self.uid, wait_s=KILL_WAIT_S)
        for lock in self._locks:
            with contextlib.suppress(ValueError, OSError):
                lock.close()

    @classmethod
    def acquire(cls) -> Slot:
        folder = private_dir(SLOT_DIR)
        uids = private_dir(UID_LOCK_DIR) if os.geteuid() == 0 else None
        for n in SLOTS:
            lock = _try_lock(folder / f"slot-{n}.lock")
            if lock is None:
                continue
            slot = cls(n, [lock])
            if uids is None:
                return slot
            uid_lock = _try_lock(uids / f"uid-{slot.uid}.lock")
            if uid_lock is None:  # another slot folder's worker holds this uid
                lock.close()
                continue
            slot._locks.append(uid_lock)
            kill_uid(slot.uid)
            return slot
        raise SandboxError(f"all {len(SLOTS)} sandbox slots of this node are taken (locks in {SLOT_DIR})")


def _try_lock(path: Path) -> IO[bytes] | None:
    """`path` (made 0600 if missing, never through a symlink) held under an
    exclusive flock, or None if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    f = os.fdopen(fd, "r+b")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


class Cgroups:
    """The cgroups of one sandbox."""

    def __init__(self, kind: str, dirs: dict[str, Path], parent: str = "/"):
        self.kind = kind
        self.dirs = dirs  # controller -> folder (v2: one folder under "all")
        self.parent = parent
        """The cgroup that the sandbox's sit under: this process's own (its memory one, in v1)."""

    @property
    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def counter_files(self) -> dict[str, str]:
        """Files the resident reads to tell which limit fired (bound read-only into the sandbox)."""
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
        where = f"cgroup {self.kind} {self.parent}"
        return {"memory": where, "processes": where, "cpu_time": where}

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
        own = _own_cgroups()
        dirs = {ctl: V1 / ctl / own.get(ctl, "/").lstrip("/") / "sarl" / name for ctl in CONTROLLERS}
        cg = cls("v1", dirs, own.get("memory", "/"))
        if all(d.is_dir() for d in dirs.values()):
            cg.kill_all()  # the slot's cgroups are reused; kill what a dead predecessor left in them
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        cg.set_limits(limits)
        return cg

    @classmethod
    def _create_v2(cls, name: str, limits: Limits) -> Cgroups:
        own = _own_cgroups()[""]
        d = V1 / own.lstrip("/") / f"sarl-{name}"
        cg = cls("v2", {"all": d}, own)
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
        # until the cgroups are empty, bounded by time, not by a count of looks: on a loaded
        # machine a killed process takes longer to leave, and the slot is reused after this
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:
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


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller (`"memory": "/slurm/uid_0/job_12"`), and "" for v2."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for ctl in controllers.split(",") if controllers else [""]:
            out[ctl.removeprefix("name=")] = path
    return out


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone
    return stat[stat.rindex(")") + 2] == "Z"
