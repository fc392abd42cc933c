"""What a sandbox must not reach on a shared node: the worker's keys, another
user's files, memory beyond the job's allocation, the hypervisor, new user
namespaces, unbounded relay threads, and what an earlier episode left in the
resident's memory."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import sandboxes.cgroups as cg
from sandboxes import open_sandbox
from sandboxes.base import SandboxError
from sandboxes.config import SandboxConfig

ADD_KEY = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "print(libc.syscall(248, b'user', b'{desc}', b'hunter2', 7, ctypes.c_long({ring})))\n"
)


def _keys_inside(sb: object) -> str:
    return sb.exec(["/bin/cat", "/proc/keys"]).stdout.decode()  # type: ignore[attr-defined]


def test_the_workers_session_keyring_is_out_of_reach() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(248, b"user", b"sarl-host-krb5-ticket", b"secret", 6, ctypes.c_long(-3)) > 0  # @s
    assert "sarl-host-krb5-ticket" in Path("/proc/keys").read_text()
    with open_sandbox(SandboxConfig()) as sb:
        assert "sarl-host-krb5-ticket" not in _keys_inside(sb)


def test_a_key_an_episode_leaves_in_the_slot_users_keyring_is_gone_after_reset_and_close(own_slot: int) -> None:
    # own_slot: the next sandbox gets the same slot, so the same uid
    with open_sandbox(SandboxConfig()) as sb:
        added = sb.run_snippet(ADD_KEY.format(desc="left-by-episode-1", ring=-4))  # @u
        assert int(added.stdout) > 0, added.stderr
        assert "left-by-episode-1" in _keys_inside(sb)
        sb.reset()
        assert "left-by-episode-1" not in _keys_inside(sb)
        sb.run_snippet(ADD_KEY.format(desc="left-by-episode-2", ring=-4))
    with open_sandbox(SandboxConfig()) as sb:
        assert "left-by-episode-2" not in _keys_inside(sb)


def test_starting_a_sandbox_runs_no_python_between_fork_and_exec() -> None:
    """The workers that start sandboxes run threads. A child forked with
    Python to run before its exec (a `preexec_fn`, or os.fork) can deadlock
    on a lock another thread held, and runs the interpreter's at-fork hooks
    in the parent too: a verifier's thread pool failed in `submit` with
    "release unlocked lock" while one of its threads started a sandbox.
    Starting a sandbox, persistent or one-shot with files, runs no at-fork
    hook; what the child did instead (cgroups, keyrings, limits) still holds
    (the limits here; the cgroups in tests/test_sandbox.py, the keyrings above)."""
    from sandboxes.oneshot import run_once

    forks: list[str] = []
    os.register_at_fork(before=lambda: forks.append(threading.current_thread().name))
    with open_sandbox(SandboxConfig()) as sb:
        assert sb.run_snippet("print(6 * 7)").stdout.strip() == b"42"
    out = run_once(["/bin/sh", "-c", "cat /sandbox/a.txt; ulimit -c"], files={"a.txt": b"hi\n"})
    assert forks == []
    assert out.stdout.decode().split() == ["hi", "0"], out  # the files fed, the limits set (cgroups: test_limits)


def test_a_slot_folder_that_is_not_ours_alone_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir(mode=0o777)
    open_to_all.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    for path, why in ((theirs, "belongs to uid 12345"), (open_to_all, "writable by other users"), (link, "symlink")):
        with pytest.raises(SandboxError, match=why):
            cg.private_dir(path)
    made = cg.private_dir(tmp_path / "new")
    assert made.stat().st_mode & 0o777 == 0o700


def test_slot_lock_files_are_private_to_the_worker(own_slot: int, tmp_path: Path) -> None:
    slot = cg.Slot.acquire()
    try:
        assert (tmp_path / "slots").stat().st_mode & 0o777 == 0o700
        assert (tmp_path / "slots" / f"slot-{own_slot}.lock").stat().st_mode & 0o777 == 0o600
    finally:
        slot.release()


def test_as_root_a_second_slot_folder_cannot_take_a_uid_in_use_nor_kill_its_processes(
    own_slot: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers on one node with different slot folders (`SARL_SANDBOX_SLOTS`):
    as root, slot n of either is uid 100000 + n, and taking a slot kills that
    uid's processes. The uid lock keeps the second folder off a uid in use."""
    if os.geteuid() != 0:
        pytest.skip("as a user, a sandbox's uid is its own user namespace's, not the node's")
    first = cg.Slot.acquire()
    sandboxed = subprocess.Popen(["/bin/sleep", "60"], user=first.uid)
    try:
        monkeypatch.setattr(cg, "SLOT_DIR", tmp_path / "another-workers-slots")
        with pytest.raises(SandboxError, match="all 1 sandbox slots of this node are taken"):
            cg.Slot.acquire()
        assert sandboxed.poll() is None, "a second slot folder killed the first one's sandbox"
    finally:
        first.release()  # kills the uid's processes: the sleep too
    assert sandboxed.wait(timeout=15) == -9
    second = cg.Slot.acquire()  # free again, through the other folder
    assert second.n == own_slot
    second.release()


def _job_cgroup() -> tuple[Path, str, str]:
    """A stand-in for a Slurm job's cgroup, as a child of this process's own:
    (its folder, how a sandbox result names it, the line of a sandbox's
    /proc/PID/cgroup that must lie under it). cgroup v1 (or hybrid): the
    memory controller's hierarchy; v2 only: the unified one, where the
    memory and pids controllers must be delegated to the child."""
    if Path("/sys/fs/cgroup/memory").is_dir():
        return Path("/sys/fs/cgroup/memory/sarl-test-job"), "cgroup v1 /sarl-test-job", ":memory:"
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    own = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
    parent = Path("/sys/fs/cgroup") / own.lstrip("/")
    controllers = (parent / "cgroup.subtree_control").read_text().split()
    if not {"memory", "pids"} <= set(controllers):
        pytest.skip(f"cgroup v2: {parent} does not delegate memory and pids to its children ({controllers})")
    job = parent / "sarl-test-job"
    return job, f"cgroup v2 {own.rstrip('/')}/sarl-test-job", "0::"


def test_sandbox_cgroups_sit_under_the_callers_own_cgroup(tmp_path: Path) -> None:
    """A Slurm job's memory limit must cover its sandboxes: they are children
    of the job's cgroup, wherever that is, in cgroup v1 or v2."""
    job, named, line_of = _job_cgroup()
    job.mkdir(exist_ok=True)
    code = (
        "import os, sys\n"
        f"open({str(job / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
        "from sandboxes import open_sandbox\n"
        "with open_sandbox() as sb:\n"
        "    r = sb.run_snippet('pass')\n"
        "    print(r.enforced['memory'])\n"
        "    print(open(f'/proc/{sb.proc.pid}/cgroup').read())  # the sandbox's first process, seen from the host\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert named in out.stdout, out.stdout
        where = next(line for line in out.stdout.splitlines() if line_of in line and "/sarl-test-job" in line)
        inside = where.split(":", 2)[2].removeprefix(named.split(" ", 2)[2])
        assert inside.startswith(("/sarl/sb", "/sarl-sb")), where  # v1: <job>/sarl/sbN; v2: <job>/sarl-sbN
    finally:
        for child in sorted([*job.glob("sarl/*"), *job.glob("sarl-*")], reverse=True):
            if child.is_dir():
                child.rmdir()
        for d in (job / "sarl", job):
            if d.exists():
                d.rmdir()


def test_vsock_and_new_user_namespaces_are_refused_while_threads_and_fork_work() -> None:
    with open_sandbox(SandboxConfig()) as sb:
        r = sb.run_snippet(
            "import os, socket, threading\n"
            "try:\n    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); print('vsock open')\n"
            "except OSError as e:\n    print('vsock', e.errno)\n"
            "t = threading.Thread(target=lambda: None); t.start(); t.join(); print('thread')\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
            "print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        )
        userns = sb.exec(["/bin/sh", "-c", "unshare -U true; echo $?; unshare -Urn true; echo $?"])
    assert r.stdout.decode().split("\n")[:3] == ["vsock 97", "thread", "fork 7"], r.stdout
    assert userns.stdout.decode().split() == ["1", "1"], userns.stderr
    assert r.enforced["syscalls"].startswith("seccomp")


MEMORY_SCAN = (
    "import ctypes, hashlib, re\n"
    "found = False\n"
    "for line in open('/proc/self/maps'):\n"
    "    m = re.match(r'([0-9a-f]+)-([0-9a-f]+) rw', line)\n"
    "    if not m:\n        continue\n"
    "    a, b = int(m[1], 16), int(m[2], 16)\n"
    "    data = ctypes.string_at(a, b - a)  # this process's own memory (/proc/self/mem: non-dumpable)\n"
    "    i = data.find(b'<<<')\n"
    "    while i >= 0 and not found:\n"
    "        found = hashlib.sha256(data[i + 3 : i + 35]).hexdigest() == {digest!r}\n"
    "        i = data.find(b'<<<', i + 1)\n"
    "print(found)\n"
)


def test_nothing_of_one_request_is_in_the_memory_of_the_next() -> None:
    """A secret that one snippet held (its code, a file it wrote, what it
    printed) is in no later snippet's memory: not the next one, not one
    after a `reset_after`, not one after a reset. Each snippet is forked from
    a handler that read its own message only, from a resident that reads
    none. The scanner knows only the secret's hash; run in the snippet that
    holds the secret, it finds it (the scan works)."""
    import hashlib

    secret = os.urandom(16).hex()
    scan = MEMORY_SCAN.format(digest=hashlib.sha256(secret.encode()).hexdigest())
    leave = f"s = '<<<{secret}>>>'\nprint(s * 2000)\nopen('/sandbox/f', 'w').write(s * 100)\n"
    with open_sandbox(SandboxConfig()) as sb:
        holder = sb.run_snippet(leave + scan, files={"/sandbox/given.txt": f"<<<{secret}>>>".encode()})
        next_request = sb.run_snippet(scan)
        sb.run_snippet(leave, reset_after=True)
        after_reset_after = sb.run_snippet(scan)
        sb.run_snippet(leave)
        sb.exec(["/bin/sh", "-c", f"echo '<<<{secret}>>>'"])
        after_exec = sb.run_snippet(scan)
        sb.reset()
        next_episode = sb.run_snippet(scan)
    assert holder.stdout.decode().endswith("True\n"), holder.stderr  # the scan finds it where it is
    for r in (next_request, after_reset_after, after_exec, next_episode):
        assert r.stdout == b"False\n", r.stderr


def test_the_host_is_not_described_in_the_sandboxs_proc() -> None:
    """bubblewrap is the sandbox's pid 1, and its command line held every
    host path it bound (slot folders, cgroup counters, the interpreter's
    tree); the options now reach it through a pipe. The host's key users
    and load average are masked."""
    from sandboxes import run_once
    from sandboxes.cgroups import SLOT_DIR

    show = "tr '\\0' ' ' < /proc/1/cmdline; echo; cat /proc/key-users; echo '|'; cat /proc/loadavg"
    with open_sandbox(SandboxConfig()) as sb:
        resident = sb.exec(["/bin/sh", "-c", show]).stdout.decode()
    oneshot = run_once(["/bin/sh", "-c", show]).stdout.decode()
    host = [str(SLOT_DIR), "/sys/fs/cgroup", str(Path(sys.prefix)), str(Path(__file__).parents[1])]
    for seen in (resident, oneshot):
        cmdline, rest = seen.split("\n", 1)
        assert " --args " in cmdline and "--ro-bind" not in cmdline and not any(h in cmdline for h in host), cmdline
        key_users, loadavg = rest.split("|\n")
        assert key_users.strip() == "" and loadavg == "0.00 0.00 0.00 1/1 1\n", rest


def test_a_snippet_cannot_make_itself_dumpable_again() -> None:
    """Non-dumpable processes cannot be read through /proc/PID/mem by the
    sandbox's uid; the seccomp filter keeps them so."""
    code = (
        "import ctypes, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.prctl(4, 1, 0, 0, 0), errno.errorcode.get(ctypes.get_errno()))\n"
        "print(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE\n"
        "print(libc.prctl(4, 0, 0, 0, 0))  # making oneself non-dumpable stays allowed\n"
    )
    with open_sandbox(SandboxConfig()) as sb:
        r = sb.run_snippet(code)
    assert r.stdout.decode().split("\n")[:3] == ["-1 EPERM", "0", "0"], (r.stdout, r.stderr)


def test_relay_connections_are_capped_and_reaped(tmp_path: Path) -> None:
    from sandboxes.netrelay import HostRelays

    upstream = socket.create_server(("127.0.0.1", 0))
    port = upstream.getsockname()[1]
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        upstream.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(upstream.accept()[0])
            except TimeoutError:
                continue

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    before = threading.active_count()
    relays = HostRelays([f"127.0.0.1:{port}"], str(tmp_path / "net"), max_connections=8)
    clients = []
    try:
        for _ in range(100):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(relays.sockets[port])
            clients.append(c)
        time.sleep(1.0)
        assert len(relays.conns.open) <= 2 * 8 and relays.conns.refused >= 90
        assert threading.active_count() - before <= 1 + 2 * 8  # the accept loop, two per relayed connection
    finally:
        relays.close()
        for c in clients:
            c.close()
        stop.set()
        server.join()
        upstream.close()
    deadline = time.time() + 5
    while threading.active_count() > before and time.time() < deadline:
        time.sleep(0.1)
    assert threading.active_count() <= before and not relays.conns.open
