"""The faults `sarl chaos` injects into a running run on the local Slurm, and
how it sees each one healed. Every fault is done to the real thing: a signal
to the task's process, `scancel`, a job of the high-priority partition, the
node's `slurmd` stopped and started again.

A fault is healed (`Fault.healed`) when the harmed tasks run again: each has
a start recorded after the fault, or has finished its work (a task killed
near the end may have nothing left to do). A killed sandbox costs a retry of
its episode, not a restart: it is healed when the worker has played another
episode since.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from rl.fsio import read_json
from rl.run.rundir import RunDir

KINDS = ("sigkill", "scancel", "preempt", "sigstop", "sandbox", "slurmd")
"""sigkill: a role's process, no signal handler runs; scancel: one array
task; preempt: a job of the `urgent` partition that needs the whole node;
sigstop: a generator stops answering (found by its stale heartbeat);
sandbox: a bubblewrap sandbox killed under a running episode; slurmd: the
node's daemon stopped for `SLURMD_DOWN_S`, then started again."""

SLURMD_DOWN_S = 5.0
URGENT_S = 5
"""How long the preempting job holds the node."""


@dataclass
class Fault:
    """One injection: what was harmed, and when it was healed."""

    kind: str
    role: str
    """The harmed role (`*` for the whole run, `node` for slurmd)."""
    tasks: list[tuple[str, int]]
    """The (role, task) pairs expected to start again."""
    at: float
    detail: str
    healed_at: float | None = None
    episodes_before: int = 0
    """sandbox: the worker's episodes played when its sandbox was killed."""
    starts_before: dict[str, int] = field(default_factory=dict)
    """`role/task` -> its number of starts when the fault was done."""

    @property
    def recovery_s(self) -> float | None:
        return None if self.healed_at is None else self.healed_at - self.at


def _state(rd: RunDir, role: str, task: int) -> dict:
    return read_json(rd.state_path(role, task)) or {}


def _beat(rd: RunDir, role: str, task: int) -> dict:
    return read_json(rd.heartbeat_path(role, task)) or {}


def running_tasks(rd: RunDir) -> list[tuple[str, int]]:
    """(role, task) of every task that runs now and has beaten since its last start."""
    from rl.run.status import role_status

    out = []
    for role, rc in rd.config().roles().items():
        for t in role_status(rd, role, rc.workers).detail:
            starts = _state(rd, role, t.task).get("starts", [])
            beat = _beat(rd, role, t.task)
            if t.status == "RUNNING" and starts and beat.get("pid") and beat.get("at", 0) >= starts[-1]["at"] - 1:
                out.append((role, t.task))
    return out


def _fault(rd: RunDir, kind: str, role: str, tasks: list[tuple[str, int]], detail: str) -> Fault:
    before = {f"{r}/{t}": len(_state(rd, r, t).get("starts", [])) for r, t in tasks}
    return Fault(kind, role, tasks, time.time(), detail, starts_before=before)


def inject(rd: RunDir, kind: str, rng: random.Random) -> Fault | None:
    """Do one fault of `kind` to a task chosen among those running now;
    None when no task fits it at this moment (chaos tries another time)."""
    live = running_tasks(rd)
    if kind in ("sigkill", "scancel"):
        if not live:
            return None
        role, task = rng.choice(live)
        beat = _beat(rd, role, task)
        if kind == "sigkill":
            os.kill(int(beat["pid"]), signal.SIGKILL)
            return _fault(rd, kind, role, [(role, task)], f"SIGKILL to pid {beat['pid']}")
        job = str(beat["job_id"])
        subprocess.run(["scancel", job], check=True, capture_output=True)
        return _fault(rd, kind, role, [(role, task)], f"scancel {job}")
    if kind == "sigstop":
        gens = [x for x in live if x[0] == "generator"]
        if not gens:
            return None
        role, task = rng.choice(gens)
        pid = int(_beat(rd, role, task)["pid"])
        os.kill(pid, signal.SIGSTOP)
        return _fault(rd, kind, role, [(role, task)], f"SIGSTOP to pid {pid}")
    if kind == "sandbox":
        return _kill_sandbox(rd, [x for x in live if x[0] == "rollout"], rng)
    if kind == "preempt":
        if not live:
            return None
        fault = _fault(rd, kind, "*", live, "")
        job = subprocess.run(
            ["sbatch", "--parsable", "-p", "urgent", "-c", str(_node_cpus()), "-o", "/dev/null",
             "--wrap", f"sleep {URGENT_S}"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        fault.detail = f"urgent job {job} takes the node for {URGENT_S} s"
        return fault
    if kind == "slurmd":
        fault = _fault(rd, kind, "node", [], "")
        pid = _slurmd_pid()
        os.kill(pid, signal.SIGKILL)
        time.sleep(SLURMD_DOWN_S)
        subprocess.run(["slurmd"], check=True, capture_output=True)
        fault.detail = f"slurmd (pid {pid}) killed, started again after {SLURMD_DOWN_S:.0f} s"
        return fault
    raise ValueError(f"unknown fault kind {kind!r}")


def _kill_sandbox(rd: RunDir, workers: list[tuple[str, int]], rng: random.Random) -> Fault | None:
    """SIGKILL a bubblewrap process under a rollout worker, while an episode
    runs in it: looked for during up to 20 s."""
    deadline = time.time() + 20
    while workers and time.time() < deadline:
        role, task = rng.choice(workers)
        root = int(_beat(rd, role, task).get("pid", 0))
        sandboxes = [p for p in _descendants(root) if _comm(p) == "bwrap"]
        if sandboxes:
            victim = rng.choice(sandboxes)
            episodes = int(_state(rd, role, task).get("episodes", 0))
            os.kill(victim, signal.SIGKILL)
            what = f"SIGKILL to sandbox pid {victim} of {role} task {task}"
            fault = _fault(rd, "sandbox", role, [(role, task)], what)
            fault.episodes_before = episodes  # healed by progress, not by a restart
            return fault
        time.sleep(0.2)
    return None


def healed(rd: RunDir, fault: Fault) -> bool:
    """The harmed tasks run again (or finished their work); the node answers."""
    if fault.kind == "slurmd":
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
        return out.returncode == 0 and all(s.strip() in ("idle", "mix", "alloc") for s in out.stdout.split())
    if fault.kind == "sandbox":
        role, task = fault.tasks[0]
        st = _state(rd, role, task)
        return (
            bool(st.get("done"))
            or int(st.get("episodes", 0)) > fault.episodes_before
            or bool(len(st.get("starts", [])) > 0 and st["starts"][-1]["at"] > fault.at)
        )
    for role, task in fault.tasks:
        st = _state(rd, role, task)
        again = len(st.get("starts", [])) > fault.starts_before.get(f"{role}/{task}", 0)
        if not (again or st.get("done")):
            return False
    return True


# ------------------------------------------------------------------ /proc
def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(p.name))
    return out


def _descendants(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _node_cpus() -> int:
    out = subprocess.run(["sinfo", "-h", "-o", "%c"], check=True, capture_output=True, text=True).stdout.split()
    return max(int(x.rstrip("+")) for x in out)


def _slurmd_pid() -> int:
    out = subprocess.run(["scontrol", "show", "config"], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("SlurmdPidFile"):
            return int(Path(line.split("=", 1)[1].strip()).read_text().split()[0])
    raise RuntimeError("scontrol show config names no SlurmdPidFile")
