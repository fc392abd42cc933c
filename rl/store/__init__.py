"""The exchange store: the only channel between roles (`RUN_DIR/store.zarr`).

    rollouts/<writer>/<seq>/   rollout batches (rl.store.rollouts)
    weights/v<version>/        weight versions (rl.store.weights)
    weights/pins/              versions held by checkpoints or generators
    given_up/<group>           groups no step will train on (rl.store.given_up)

Every batch and version is a committed group: built under a private name,
committed by one rename with its marker or manifest inside, verified by
checksums on read. A given-up record is one file, committed by one rename.
"""

from __future__ import annotations

import os
from pathlib import Path

from rl.layout import RunLayout
from rl.store.cursor import Cursor
from rl.store.given_up import GivenUp
from rl.store.rollouts import BadRollout, RolloutBatch, RolloutReader, RolloutWriter, Sample
from rl.store.weights import Published, UnknownVersion, WeightStore
from rl.store.zgroup import CorruptData, Damage, StoreError

__all__ = [
    "BadRollout",
    "CorruptData",
    "Damage",
    "GivenUp",
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

    @classmethod
    def of_run(cls, run_dir: str | os.PathLike[str]) -> Store:
        return cls(RunLayout(run_dir).store_path)

    def writer(self, writer_id: str) -> RolloutWriter:
        return RolloutWriter(self.path, writer_id)

    def reader(self) -> RolloutReader:
        return RolloutReader(self.path)

    @property
    def weights(self) -> WeightStore:
        return WeightStore(self.path)

    @property
    def given_up(self) -> GivenUp:
        return GivenUp(self.path)
