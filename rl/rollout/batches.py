"""Complete groups into committed batches: which groups the store already
holds, and how the groups waiting are cut into batches."""

from __future__ import annotations

from typing import TypeVar

from rl.store import Store

T = TypeVar("T")


def committed_groups(store: Store) -> set[int]:
    """The groups that any committed batch holds, from episode identities
    (the store, not a worker's state file, is the truth)."""
    reader = store.reader()
    out: set[int] = set()
    for key in reader.committed():
        out |= {int(e.split("/")[0]) for e in reader.info(key).episode_ids if e}
    return out


def due(pending: list[T], size: int, partial: bool) -> tuple[list[list[T]], list[T]]:
    """(the batches to write now, the groups left waiting): `size` groups
    to a batch, in the order they finished; a smaller remainder too when
    `partial`, else it waits for more. (One batch of every group that
    finished together would let a learner step, which takes whole batches,
    eat the groups meant for the next version.)"""
    batches: list[list[T]] = []
    while len(pending) >= size or (partial and pending):
        batches.append(pending[:size])
        pending = pending[size:]
    return batches, pending
