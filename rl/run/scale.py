"""`sarl scale RUN_DIR ROLE=N`: change a role's array size mid-run.

* generator: tasks N.. are cancelled (scaling down) or tasks old..N-1 are
  submitted (scaling up); the others keep serving.
* rollout: a worker's groups follow from its index and the number of
  workers, so every worker changes groups. Every live worker is cancelled
  first, and the new array is submitted only once none is alive: two
  owners of one group never run at once. Committed groups are read from
  every writer and never replayed; a group in flight when its worker was
  cancelled is replayed whole by its new owner (its episodes were never
  committed). Workers that had finished are started again, since their
  new groups may not be done.

The change is written into run.toml and config-history.jsonl, like any
mid-run change (`"scale": {role, from, to}`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from rl.config import dump_toml, to_plain, validate_config
from rl.errors import ConfigError, SarlError
from rl.fsio import atomic_write, read_json, write_json
from rl.run.executors import cancel_tasks, submission_label, submit_role
from rl.run.launch import Submitted
from rl.run.rundir import RunDir
from rl.run.status import role_status

SCALABLE = ("generator", "rollout")


def parse_target(text: str) -> tuple[str, int]:
    role, eq, n = text.partition("=")
    if not eq or not n.strip().isdigit():
        raise ConfigError(f"{text!r}: expected ROLE=N, e.g. rollout=8")
    return role.strip(), int(n)


def scale(rd: RunDir, role: str, n: int, say: Callable[[str], None] = print, wait_s: float = 180.0) -> list[Submitted]:
    import tomllib

    with rd.lock():
        frozen = rd.config()
        if role not in frozen.roles():
            raise ConfigError(f"{role}: the run has no [{role}] section (it has {', '.join(frozen.roles())})")
        if role not in SCALABLE:
            raise ConfigError(f"{role}: only {' and '.join(SCALABLE)} can be scaled; {role} runs a fixed number")
        old = frozen.roles()[role].workers
        raw = tomllib.loads(rd.config_path.read_text())
        raw[role]["workers"] = n
        new = validate_config(raw, f"{role}={n}", cluster=frozen.executor.type, base_dir=rd.path)
        if n == old:
            say(f"{role} already has {n} workers")
            return []
        st = role_status(rd, role, max(old, n))
        if st.scheduler_error:
            raise SarlError(f"{role}: {st.scheduler_error}; nothing changed")
        stop = [t.task for t in st.detail if t.live and (role == "rollout" or t.task >= n)]
        _cancel(rd, role, stop)
        _wait_gone(rd, role, max(old, n), stop, wait_s)
        if role == "rollout":
            for t in range(n):  # its groups change: a finished worker may have new ones
                state = read_json(rd.state_path(role, t))
                if state and state.get("done"):
                    write_json(rd.state_path(role, t), {**state, "done": False})
        atomic_write(rd.config_path, dump_toml(new))
        with open(rd.path / "config-history.jsonl", "a") as f:
            entry = {"at": time.time(), "changed": [f"{role}.workers"], "scale": {"role": role, "from": old, "to": n}}
            f.write(json.dumps({**entry, "config": to_plain(new)}) + "\n")
        st = role_status(rd, role, n)
        todo = [t.task for t in st.detail if t.status != "DONE" and not t.live]
        subs = []
        if todo:
            rec = submit_role(rd, new, role, todo)
            subs.append(Submitted(role, submission_label(rec), todo))
    say(f"scaled {role} from {old} to {n} workers" + (f"; cancelled tasks {stop}" if stop else ""))
    return subs


def _cancel(rd: RunDir, role: str, tasks: list[int]) -> None:
    if not tasks:
        return
    latest: dict[int, dict[str, Any]] = {}
    for rec in rd.submissions(role):
        for t in rec["tasks"]:
            latest[t] = rec
    by_record: dict[int, tuple[dict[str, Any], list[int]]] = {}
    for t in tasks:
        rec = latest[t]
        by_record.setdefault(id(rec), (rec, []))[1].append(t)
    for rec, ts in by_record.values():
        cancel_tasks(rec, ts)


def _wait_gone(rd: RunDir, role: str, ntasks: int, tasks: list[int], wait_s: float) -> None:
    deadline = time.time() + wait_s
    while tasks:
        st = role_status(rd, role, ntasks)
        alive = [t.task for t in st.detail if t.task in tasks and t.live]
        if not alive:
            return
        if time.time() > deadline:
            raise SarlError(f"{role}: tasks {alive} still alive {wait_s:.0f} s after their cancel; nothing submitted")
        time.sleep(1.0)
