"""Who plays which groups: shares, and a given-up worker's share taken up.

Worker k's own share is groups k, k + N, k + 2N, ... (N = rollout.workers).
Recovery gives up a worker that dies in a loop (rl.run.recovery), and asks
the rollout role's hooks (jobs/rollout.py) what to do about it. Without
more, its share would wait for a person's `sarl resume`, and the learner's
last steps with it. So the recovery round that gives worker k up hands its
share over, under the run's lock, to another worker j: it writes
RUN/recovery/rollout/share-k.json (`to`: j). Then:

  * j takes the share up: it plays the share's groups that no batch holds
    and that k did not abandon, each with the task k planned for it. A
    running j finds the record within a few seconds; a j that had finished
    is started again by the next recovery round (`stranded`), and so is a
    j that died and is not given up itself;
  * once j has played them all, it marks k's task done (`adopted_by`: j,
    and `ended_as`, which `sarl status` shows), before its own: the learner, the generators and `sarl status` then see
    the rollouts end;
  * a share follows its records: k's share handed to j, then j's to m,
    is m's (`owner`).

Exactly once: the record is written under the run's lock, as `sarl resume`
clears a given-up mark under it; k, if a person resumes it, reads the
record when it starts and plays none of its share. The episode identities
(`group/index`) do not change with the worker that plays them.

Not covered: `sarl scale` of the rollout array after a hand-over (shares
are by the task count); a run whose every worker is given up waits for a
person.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rl.fsio import read_json, write_json
from rl.layout import RunLayout

ROLE = "rollout"

log = logging.getLogger("sarl.recovery")


def record_path(rd: RunLayout, share: int) -> Path:
    return rd.recovery(ROLE) / f"share-{share:06d}.json"


def handed(rd: RunLayout, tasks: int) -> dict[int, int]:
    """Every share handed over: share -> the worker it was handed to. One
    listing of a folder (every worker asks every few seconds), and a read of
    each record, which exists only for a given-up worker."""
    out = {}
    for path in sorted(rd.recovery(ROLE).glob("share-*.json")):
        k = int(path.stem.removeprefix("share-"))
        rec = read_json(path)
        if rec is not None and k < tasks:
            out[k] = int(rec["to"])
    return out


def owner(share: int, handed: dict[int, int]) -> int:
    """The worker that plays `share` now, following its hand-overs."""
    seen = {share}
    while share in handed:
        share = handed[share]
        if share in seen:  # a cycle cannot be written (the receiver is never given up), but never loop
            break
        seen.add(share)
    return share


def shares_of(rd: RunLayout, worker: int, tasks: int) -> list[int]:
    """The shares `worker` plays: its own unless handed over, and those handed to it."""
    h = handed(rd, tasks)
    return [k for k in range(tasks) if owner(k, h) == worker]


def hand_over(rd: RunLayout, share: int, tasks: int, running: set[int], given_up: set[int]) -> int | None:
    """Give the share of given-up worker `share` to another worker, under
    the run's lock (the caller holds it): a running one first, then the
    lowest-numbered that is not given up. None when every other worker is
    given up (the share waits for a person) or it is handed over already."""
    h = handed(rd, tasks)
    if share in h:
        return None
    candidates = [j for j in range(tasks) if j != share and j not in given_up and owner(j, h) == j]
    if not candidates:
        return None
    to = min(candidates, key=lambda j: (j not in running, j))
    write_json(record_path(rd, share), {"to": to, "at": time.time()})
    return to


def stranded(rd: RunLayout, tasks: int, states: dict[int, dict[str, Any]]) -> list[int]:
    """Workers that own an unfinished share of another, yet have ended
    (`done`): each must start again to play it."""
    h = handed(rd, tasks)
    out = set()
    for k in h:
        j = owner(k, h)
        if not states.get(k, {}).get("done") and states.get(j, {}).get("done"):
            out.add(j)
    return sorted(out)


def finish(rd: RunLayout, worker: int, shares: list[int]) -> None:
    """`worker` has played every group of `shares`: the given-up workers'
    tasks among them are done, by its hand (their own process is gone)."""
    for k in shares:
        if k == worker:
            continue
        path = rd.state_path(ROLE, k)
        st = read_json(path) or {"task": k}
        if not st.get("done"):
            ended = f"given up; its groups were played by {ROLE} task {worker}"
            write_json(path, {**st, "done": True, "adopted_by": worker, "ended_as": ended, "updated_at": time.time()})


def undone(rd: RunLayout, task: int) -> None:
    """A worker that ended is to play a handed-over share: its task is not done any more."""
    path = rd.state_path(ROLE, task)
    st = read_json(path) or {}
    write_json(path, {**st, "done": False, "updated_at": time.time()})


# ------------------------------------------------- the rollout role's recovery hooks


def restart_also(rd: RunLayout, tasks: int) -> list[tuple[int, str]]:
    """Workers that ended owning a handed-over share (`stranded`), with why."""
    states = {t: read_json(rd.state_path(ROLE, t)) or {} for t in range(tasks)}
    return [(j, "ended owning a handed-over share") for j in stranded(rd, tasks, states)]


def on_given_up(rd: RunLayout, task: int, tasks: int, running: set[int], given_up: set[int]) -> dict[str, Any]:
    """Hand a given-up worker's share of the groups to another worker; the
    receiver, if it is not running, is started by the next recovery round."""
    to = hand_over(rd, task, tasks, running, given_up)
    if to is None:
        log.error("rollout task %d's share is not handed over: no other worker can take it", task)
    else:
        log.warning("rollout task %d's share is handed to rollout task %d", task, to)
    return {"share_to": to}
