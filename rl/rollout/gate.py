"""When a group may start: within the staleness bound of the published
weight version (async), or once its round's version is the newest (sync).
Waiting at the gate is waiting on the learner, not a stall."""

from __future__ import annotations

from typing import Literal

from rl.store import Store

GATE_POLL_S = 0.25
"""How often a held gate looks for a new version (a cheap listing of the store)."""

Verdict = Literal["start", "wait", "closed"]


def gate(store: Store, group: int, groups_per_step: int | None, sync: bool, max_staleness: int) -> tuple[Verdict, str]:
    """(`start`, `wait` or `closed`, why it is closed).

    Async: groups up to `max_staleness` steps ahead of the published version
    may start, and one more for each group given up anywhere in the run
    (rl.store.given_up), so that dropped groups never leave the learner
    short of a step while the gate waits for that step. Sync: a round's
    groups start with its version; a round the learner closed (its next
    version is published) is not played: the caller gives its group up."""
    if not groups_per_step:
        return "start", ""
    v = store.weights.latest() or 0
    if sync:
        r = group // groups_per_step
        if v > r:
            return "closed", f"sync: round {r} closed, version {v} is published"
        return ("start" if v == r else "wait"), ""
    ahead = (max_staleness + v + 1) * groups_per_step
    if group < ahead or group < ahead + store.given_up.count():
        return "start", ""
    return "wait", ""
