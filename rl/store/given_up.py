"""Groups that no step will train on: `store.zarr/given_up/<group>`.

A rollout worker that abandons a group (dynamic sampling dropped it,
infrastructure failures outlasted the retries, its task was quarantined, its
sync round closed) records it here before anything else, and so does the
learner for a committed group it drops as stale (a group no step will train
on). Whoever counts on groups reads it:

- a sync learner counts a round whole when every group of the round is
  committed or given up, and trains on what came (nothing at all: a step
  that only publishes the next version), instead of waiting for a round
  that will never fill;
- an async rollout gate lets one more group start for each given-up one,
  so the learner's `samples_per_step` can still be met.

One small JSON file per group, written once (through a temporary name and a
rename); its name is the group, so counting them is a directory listing. A
group can be both given up and committed (a worker killed between the
record and its state replays it): readers take the union, and the samples
of a round already closed are dropped as stale, never trained twice.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rl.fsio import read_json, sweep_temporaries, write_json

RELIST_S = 5.0
"""`count()` lists the folder again at least this often, even when its
mtime has not changed (a filesystem whose mtimes are coarser than the
writes between two looks)."""


class GivenUp:
    def __init__(self, store: str | os.PathLike[str]):
        self.folder = Path(store) / "given_up"
        self._counted: tuple[int, float, int] | None = None
        """(folder mtime in ns, when listed, how many) of the last `count()`."""

    def path(self, group: int) -> Path:
        return self.folder / f"{group:010d}"

    def record(self, group: int, reason: str, writer: str) -> None:
        """Say that `group` will not be committed by `writer`, and why."""
        if group < 0:
            raise ValueError(f"group must be >= 0, got {group}")
        if not self.path(group).exists():
            write_json(self.path(group), {"group": group, "reason": reason, "writer": writer, "at": time.time()})

    def groups(self) -> set[int]:
        """Every group given up (names alone: one listing, no file read)."""
        if not self.folder.is_dir():
            return set()
        return {int(p.name) for p in self.folder.iterdir() if p.name.isdigit()}

    def count(self) -> int:
        """How many groups are given up: `len(groups())`, listed again only
        when the folder changed (one stat) or RELIST_S has passed. The async
        rollout gate asks it every quarter second while it waits, and a
        folder of thousands of names on a parallel filesystem is not free to
        list."""
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            return 0
        now = time.monotonic()
        c = self._counted
        if c is None or c[0] != mtime or now - c[1] >= RELIST_S:
            c = self._counted = (mtime, now, len(self.groups()))
        return c[2]

    def reason(self, group: int) -> str | None:
        rec = read_json(self.path(group))
        return None if rec is None else str(rec.get("reason", ""))

    def sweep(self) -> None:
        """Temporaries that killed writers left (every worker writes here: one
        younger than a minute may be another's, about to be renamed)."""
        sweep_temporaries(self.folder, older_than_s=60.0)
