"""The resident process that runs inside a persistent sandbox (stdlib only, Python >= 3.8).

It is the sandbox's only long-lived process besides bubblewrap's init. The
host talks to it over its stdin/stdout: each message is a 4-byte header
length, a 4-byte payload length, a JSON header, then the payload bytes.

  exec     run a command (payload: its stdin) under the limits
  snippet  run Python code in a forked child of this (pre-imported) process:
           the resident executor, a few ms per call
  write    write a file under /sandbox or /tmp (payload: the content)
  read     read a file (reply payload: the content)
  reset    kill every process, empty /sandbox and /tmp, empty this uid's
           keyrings, then start over as a fresh interpreter (exec): no byte
           of the episode before stays in memory for the next one to find.
           The new resident greets the host again
  ping     liveness

The resident itself never reads a message. For each one it forks a handler
from its clean self, which reads the message, runs it (forking the command
or snippet from the handler), answers, and exits. A snippet therefore
inherits the memory of its own message only: nothing of an earlier
sample, episode or task (their code, files, outputs, hidden tests) was ever
in the process it was forked from. After every message, and inside the
handler after every exec or snippet, every other process of the sandbox's
pid namespace is killed, so nothing a command left behind (setsid, double
fork, daemons) survives into the next one. The resident and its handlers
are non-dumpable, and the seccomp filter refuses to make a process dumpable
again (sandboxes/seccomp.py), so code running as the same uid cannot read
their memory or open their pipes through /proc; that code can still kill
them, which the host sees as a dead sandbox and replaces.

`Watch` (which limit fired) is shared with the host, which imports this file
for one-shot runs.
"""

from __future__ import annotations

import json
import os
import resource  # here, not in each forked child: importing it there cost 0.5 ms per command
import select
import signal
import struct
import sys
import time
import traceback
import types

CG = "/run/sarl/cg"  # read-only binds of this sandbox's cgroup counters
WORK = "/sandbox"  # the private writable work dir (tmpfs); /tmp is the other one
HEADER = struct.Struct("<II")


class Watch:
    """Reads cgroup counters (where present) and tells which limit fired."""

    def __init__(self, cg_dir, limits):
        self.cg = cg_dir
        self.limits = limits
        self.base = self._counters()
        self.disk_base = {}
        """Blocks and inodes in use on each writable path when the run starts."""
        for p in self.disk_paths((WORK, "/tmp")):
            try:
                st = os.statvfs(p)
            except OSError:
                continue
            self.disk_base[p] = (st.f_blocks - st.f_bfree, st.f_files - st.f_ffree)

    def _read(self, name):
        try:
            with open(os.path.join(self.cg, name)) as f:
                return f.read()
        except OSError:
            return None

    def _counters(self):
        out = {}
        text = self._read("pids.events")
        if text is not None:  # v1: "max N"; v2: "max N"
            out["pids"] = int(text.split()[1])
        text = self._read("memory.oom_control")  # v1
        if text is not None:
            fields = dict(line.split() for line in text.splitlines() if line.strip())
            out["memory"] = int(fields.get("oom_kill", 0))
        text = self._read("memory.events")  # v2
        if text is not None:
            fields = dict(line.split() for line in text.splitlines() if line.strip())
            out["memory"] = int(fields.get("oom_kill", 0)) + int(fields.get("max", 0))
        text = self._read("memory.failcnt")  # v1: hits of the limit
        if text is not None:
            out["memory_failcnt"] = int(text)
        text = self._read("cpuacct.usage")  # v1, ns
        if text is not None:
            out["cpu_ns"] = int(text)
        text = self._read("cpu.stat")  # v2
        if text is not None and "usage_usec" in text:
            fields = dict(line.split() for line in text.splitlines() if line.strip())
            out["cpu_ns"] = int(fields["usage_usec"]) * 1000
        return out

    def fired(self, disk_paths=()):
        """The name of a limit that was hit since the watch started, or None."""
        now = self._counters()
        if now.get("pids", 0) > self.base.get("pids", 0):
            return "processes"
        if now.get("memory", 0) > self.base.get("memory", 0):
            return "memory"
        cpu = self.limits.get("cpu_s")
        if cpu and "cpu_ns" in now and now["cpu_ns"] - self.base.get("cpu_ns", 0) > cpu * 1e9:
            return "cpu_time"
        cap = self.limits.get("disk_bytes")
        for p in self.disk_paths(disk_paths):
            try:
                st = os.statvfs(p)
            except OSError:
                continue
            used = (st.f_blocks - st.f_bfree, st.f_files - st.f_ffree)
            # a process that found the disk already full (an earlier run filled
            # it) did not hit the limit: only one that used more space did
            if p in self.disk_base and used[0] <= self.disk_base[p][0] and used[1] <= self.disk_base[p][1]:
                continue
            if st.f_bavail == 0 or st.f_favail == 0 or (cap and used[0] * st.f_frsize >= cap):
                return "disk"
        return None

    def disk_paths(self, default):
        return default

    def memory_hit(self):
        return self._counters().get("memory_failcnt", 0) > self.base.get("memory_failcnt", 0)

    def cpu_s(self):
        now = self._counters()
        if "cpu_ns" not in now:
            return None
        return (now["cpu_ns"] - self.base.get("cpu_ns", 0)) / 1e9


def apply_rlimits(limits):
    """Per-process limits, inherited by children (set in the child before exec)."""
    if limits.get("cpu_s"):
        s = int(limits["cpu_s"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (s, s + 1))
    if limits.get("rlimit_as"):
        resource.setrlimit(resource.RLIMIT_AS, (limits["rlimit_as"],) * 2)
    if limits.get("rlimit_nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["rlimit_nproc"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def collect(pid, fds, limits, watch, disk_paths, stdin=b"", stdin_fd=None):
    """Wait for `pid`, reading its stdout/stderr, enforcing wall time, output
    size and (through `watch`) cgroup limits. Output written by processes it
    left behind more than 50 ms after it exited is not collected. Returns
    (status, out, err, truncated, limit); on a limit `kill_tree()` is the
    caller's job."""
    bufs = {fd: bytearray() for fd in fds}
    truncated = {fd: False for fd in fds}
    cap = limits.get("output_bytes", 1 << 20)
    deadline = time.monotonic() + limits.get("wall_s", 60)
    open_fds = list(fds)
    pending = memoryview(stdin)
    wfd = stdin_fd if stdin_fd is not None and pending else None
    if stdin_fd is not None and not pending:
        os.close(stdin_fd)
    status, limit = None, None
    next_check = 0.0
    drain_until = 0.0
    while True:
        # once the pipes are closed the child is exiting: poll its status closely
        timeout = max(0.0, min(0.005 if open_fds else 0.0002, deadline - time.monotonic()))
        try:
            r, w, _ = select.select(open_fds, [wfd] if wfd is not None else [], [], timeout)
        except InterruptedError:
            r, w = [], []
        for fd in r:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
                continue
            room = cap - len(bufs[fd])
            if len(chunk) > room:
                bufs[fd] += chunk[: max(0, room)]
                truncated[fd] = True
                limit = "output"
            else:
                bufs[fd] += chunk
        if w and wfd is not None:
            try:
                n = os.write(wfd, pending[:65536])
                pending = pending[n:]
            except BrokenPipeError:
                pending = pending[:0]
            if not pending:
                os.close(wfd)
                wfd = None
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                # what it left running may hold the pipes open: drain briefly, then stop
                drain_until = time.monotonic() + 0.05
        if limit is None and time.monotonic() >= next_check:
            limit = watch.fired(disk_paths)
            next_check = time.monotonic() + 0.02
        if limit is None and time.monotonic() >= deadline:
            limit = "wall_time"
        if limit is not None:
            break
        if status is not None and (not open_fds or time.monotonic() > drain_until):
            break
    if limit is None:  # it may have hit one and ended between two checks
        limit = watch.fired(disk_paths)
    if wfd is not None:
        os.close(wfd)
    return status, bytes(bufs[fds[0]]), bytes(bufs[fds[1]]), (truncated[fds[0]], truncated[fds[1]]), limit


def describe(status):
    """(exit_code, signal) of a wait status; (None, None) if still running."""
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status), os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


# ----------------------------------------------------------------- the resident


def _kill_tree(keep=()):
    """SIGKILL every process of this pid namespace but init, ourselves and
    `keep` (a handler keeps the resident that forked it), and reap ours."""
    spare = {1, os.getpid(), *keep}
    for _ in range(200):
        if not keep:
            try:
                os.kill(-1, signal.SIGKILL)  # all but init and us, at once: a fork bomb cannot outrun it
            except ProcessLookupError:
                pass
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in spare]
        for pid in others if keep else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:  # reap our own children
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not others:
            return
        time.sleep(0.001)


_STREAM_BUF = bytearray(1 << 16)


def _stream(n, fd):
    """Copy n bytes from our stdin to fd through one reused buffer, zeroed
    after: no copy of them stays in this process for later forks to find."""
    view = memoryview(_STREAM_BUF)
    broken = False
    while n > 0:
        got = os.readv(0, [view[: min(n, len(view))]])
        if got == 0:
            raise EOFError
        if not broken:
            try:
                chunk = view[:got]
                while chunk:
                    chunk = chunk[os.write(fd, chunk) :]
            except (BrokenPipeError, OSError):
                broken = True  # the child stopped reading: keep draining our stdin
        n -= got
    view[:] = bytes(len(view))
    os.close(fd)


def _read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _send(header, payload=b""):
    data = json.dumps(header).encode()
    out = HEADER.pack(len(data), len(payload)) + data + payload
    view = memoryview(out)
    while view:
        view = view[os.write(1, view) :]


def _safe_path(path):
    real = os.path.realpath(path)
    if not (real == WORK or real.startswith(WORK + "/") or real == "/tmp" or real.startswith("/tmp/")):
        raise PermissionError("only %s and /tmp are writable: %s" % (WORK, path))
    return real


def _run(header, payload, code=None):
    limits = header.get("limits", {})
    watch = Watch(CG, limits)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.setpgid(0, 0)
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (in_r, in_w, out_r, out_w, err_r, err_w):
                os.close(fd)
            apply_rlimits(limits)
            os.chdir(header.get("cwd", WORK))
            if code is None:
                env = dict(BASE_ENV, **header.get("env", {}))
                argv = header["argv"]
                os.execvpe(argv[0], argv, env)
            sys.stdin = open(0)  # noqa: SIM115
            sys.stdout = open(1, "w", buffering=1)  # noqa: SIM115
            sys.stderr = open(2, "w", buffering=1)  # noqa: SIM115
            try:
                if not isinstance(code, types.CodeType):
                    code = compile(code, "<snippet>", "exec")
                exec(code, dict(header.get("globals", {}), __name__="__main__"))
                rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                rc = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
        except BaseException as e:
            os.write(2, ("sandbox: cannot run: %s\n" % e).encode())
            os._exit(127)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    if header.get("stream"):
        # bytes that follow the message go to the child's stdin only now, after
        # the fork: they never were in the memory the child was forked from
        _stream(header["stream"], in_w)
    status, out, err, trunc, limit = collect(
        pid,
        [out_r, err_r],
        limits,
        watch,
        (WORK, "/tmp"),
        stdin=payload,
        stdin_fd=None if header.get("stream") else in_w,
    )
    if limit is None and status is not None and status != 0 and watch.memory_hit():
        limit = "memory"  # it failed after hitting the limit: OOM-killed, or an allocation refused
    if (
        limit is None
        and status is not None
        and os.WIFSIGNALED(status)
        and os.WTERMSIG(status) in (signal.SIGXCPU,) + ((signal.SIGKILL,) if limits.get("cpu_s") else ())
        and (watch.cpu_s() or 0) >= limits.get("cpu_s", 1e18) * 0.9
    ):
        limit = "cpu_time"
    if limit is None and status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXFSZ:
        limit = "disk"
    _kill_tree(keep=(os.getppid(),))
    if status is None:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = None
    for fd in (out_r, err_r):
        os.close(fd)
    exit_code, sig = describe(status)
    return {
        "ok": True,
        "exit_code": exit_code,
        "signal": sig,
        "limit": limit,
        "duration_s": time.monotonic() - t0,
        "cpu_s": watch.cpu_s(),
        "stdout_len": len(out),
        "stdout_truncated": trunc[0],
        "stderr_truncated": trunc[1],
    }, out + err


_BIN = os.path.dirname(sys.executable)
BASE_ENV = {
    # the runtime's interpreter first: `python3` in a command is the one the sandbox runs (runtime venv:
    # sarl's, with `sandbox.packages`), not Debian's
    "PATH": ":".join(dict.fromkeys([_BIN, "/usr/local/bin", "/usr/bin", "/bin"])),
    "HOME": WORK,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",  # a verdict is reproducible: a set's order of strings must not change between runs
}


_CODE = {}  # type: dict[str, types.CodeType]


def _compiled(text):
    """Code the host runs again and again (the verifier's runner): the
    resident compiles the preloaded files (PRELOAD) once, before any
    message, and a handler finds their code here by its text; other code is
    compiled in the handler. Source that does not compile stays source: the
    child then reports the error as before."""
    code = _CODE.get(text)
    if code is None:
        try:
            code = compile(text, "<snippet>", "exec")
        except (SyntaxError, ValueError):
            return text
        if len(_CODE) < 32:
            _CODE[text] = code
    return code


def _write(path, data, mode):
    path = _safe_path(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _wipe(root):
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            for dirpath, dirnames, filenames in os.walk(path, topdown=False):
                for f in filenames:
                    os.unlink(os.path.join(dirpath, f))
                for d in dirnames:
                    full = os.path.join(dirpath, d)
                    if os.path.islink(full):
                        os.unlink(full)
                    else:
                        os.rmdir(full)
            os.rmdir(path)
        else:
            os.unlink(path)


NET = "/run/sarl/net"  # allow-listed ports: a Unix socket per port, relayed by the host
PRELOAD = "/run/sarl/preload"  # trusted code compiled once, before any message (the verifier's runner)


def _start_over():
    """Empty this uid's keyrings and exec a fresh resident on the same pipes."""
    try:
        import keys

        keys.clear_user_keyrings()
    except Exception:  # noqa: S110 (best effort: an unknown architecture has no keyring calls here)
        pass
    os.execv(sys.executable, getattr(sys, "orig_argv", [sys.executable, "-s", "-B", os.path.abspath(__file__)]))


_EOF, _RESTART = 3, 4
"""Exit codes of a handler: the host closed our stdin; the host asked for a reset."""


def serve():
    # modules snippets commonly need (the verifier's runner among them), imported
    # once here so that every forked snippet starts with them
    import ast  # noqa: F401
    import subprocess  # noqa: F401

    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import netrelay

        netrelay.start_inside(NET)
    except ImportError:
        pass
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:  # noqa: S110 (best effort: a missing libc symbol only loses hardening)
        pass
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        names = sorted(os.listdir(PRELOAD))
    except OSError:
        names = []
    for name in names:  # trusted code from the host's own files: compiled here, once, before any message
        with open(os.path.join(PRELOAD, name)) as f:
            _compiled(f.read())
    _send({"ok": True, "ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    while True:
        select.select([0], [], [])  # a message (or the end) waits: it is read by a handler, never here
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _handle()
            finally:
                os._exit(code)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = None
        _kill_tree()  # whatever the message left behind, before the next one
        ended = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
        if ended == _EOF:
            return
        if ended == _RESTART:
            _start_over()
        if ended != 0:  # killed mid-message (by the code it ran): the host sees the pipe close
            os._exit(1)


def _handle():
    """Read one message, run it, answer; the exit code tells the resident what next."""
    try:
        hlen, plen = HEADER.unpack(_read_exact(HEADER.size))
        header = json.loads(_read_exact(hlen))
        payload = _read_exact(plen) if plen else b""
    except EOFError:
        return _EOF
    op = header.get("op")
    try:
        if op == "exec":
            reply, data = _run(header, payload)
        elif op == "snippet":
            # files to write first, then the code; and, when asked, a reset
            # after it: an episode's setup, run and cleanup in one message
            off = 0
            for path, n, mode in header.get("files", ()):
                _write(path, payload[off : off + n], mode)
                off += n
            code = payload[off:].decode()
            if header.get("cache"):
                code = _compiled(code)
            reply, data = _run(header, b"", code=code)
            if header.get("reset_after"):
                for root in (WORK, "/tmp"):
                    _wipe(root)
        elif op == "write":
            _write(header["path"], payload, header.get("mode", 0o644))
            reply, data = {"ok": True}, b""
        elif op == "read":
            with open(header["path"], "rb") as f:
                data = f.read(header.get("max_bytes", 1 << 30))
            reply = {"ok": True}
        elif op == "reset":
            _kill_tree(keep=(os.getppid(),))
            for root in (WORK, "/tmp"):
                _wipe(root)
            _send({"ok": True, "restarting": True})
            return _RESTART
        elif op == "ping":
            reply, data = {"ok": True}, b""
        else:
            reply, data = {"ok": False, "error": "unknown op %r" % op}, b""
    except OSError as e:
        reply, data = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}, b""
    _send(reply, data)
    return 0


if __name__ == "__main__":
    serve()
