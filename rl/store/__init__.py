"""The exchange store: the only channel between roles (`RUN_DIR/store.zarr`).

    rollouts/<writer>/<seq>/   rollout batches (rl.store.rollouts)
    weights/v<version>/        weight versions (rl.store.weights)
    weights/pins/              versions held by checkpoints or generators
    state/<name>/<seq>/        run state snapshots: task-pool statistics, ...

Every entry is a committed group: built under a private name, committed by
one rename with its marker or manifest inside, verified by checksums on read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rl.store.rollouts import BadRollout, Cursor, RolloutBatch, RolloutReader, RolloutWriter, Sample
from rl.store.weights import Published, UnknownVersion, WeightStore
from rl.store.zgroup import MARKER, CorruptData, Damage, StoreError, read_attributes, read_group, write_committed

__all__ = [
    "BadRollout",
    "CorruptData",
    "Damage",
    "Cursor",
    "Published",
    "RolloutBatch",
    "RolloutReader",
    "RolloutWriter",
    "Sample",
    "Store",
    "StoreError",
    "UnknownVersion",
    "WeightStore",
]


class Store:
    """Entry point to one run's store."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.damaged: list[Damage] = []
        """State snapshots the last `get_state` passed over."""

    @classmethod
    def of_run(cls, run_dir: str | os.PathLike[str]) -> Store:
        return cls(Path(run_dir) / "store.zarr")

    def writer(self, writer_id: str) -> RolloutWriter:
        return RolloutWriter(self.path, writer_id)

    def reader(self) -> RolloutReader:
        return RolloutReader(self.path)

    @property
    def weights(self) -> WeightStore:
        return WeightStore(self.path)

    # ------------------------------------------------------------ run state
    def put_state(
        self, name: str, arrays: dict[str, np.ndarray], attrs: dict[str, Any] | None = None, keep: int = 3
    ) -> int:
        """Commit a new snapshot of the state table `name`; returns its sequence number."""
        import shutil

        folder = self.path / "state" / name
        folder.mkdir(parents=True, exist_ok=True)
        seqs = self._state_seqs(name)
        seq = seqs[-1] + 1 if seqs else 0
        while not write_committed(folder / f"{seq:010d}", arrays, attrs=attrs, marker={"name": name, "seq": seq}):
            seq += 1  # a concurrent writer took this number
        for old in self._state_seqs(name)[:-keep]:
            shutil.rmtree(folder / f"{old:010d}", ignore_errors=True)
        return seq

    def get_state(self, name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """The newest sound snapshot of `name`: (arrays, attributes), or None.
        A damaged snapshot is passed over for the one before it, and listed
        in `self.damaged`."""
        self.damaged = []
        for seq in reversed(self._state_seqs(name)):
            group = self.path / "state" / name / f"{seq:010d}"
            try:
                arrays, _ = read_group(group)
                return arrays, read_attributes(group)
            except StoreError as e:
                self.damaged.append(Damage(str(group), str(e)))
        return None

    def _state_seqs(self, name: str) -> list[int]:
        folder = self.path / "state" / name
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / MARKER).exists())
