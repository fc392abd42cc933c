"""Learner checkpoints: model state plus the rollout cursor, committed together.

    checkpoints/learner/step-<step:010d>/   one complete checkpoint
        cursor.json                         the consumed rollout batches
        meta.json                           step, weight version, RNG, ... (written last)
        ...                                 whatever the learner writes (DeepSpeed files)
    checkpoints/learner/LATEST              name of the newest complete one (a pointer)

A checkpoint is built under a temporary name and renamed into place: that
rename commits it. LATEST is written after it, so it can lag by one after a
crash; the newest complete checkpoint, not LATEST, is what resumes. The cursor travels inside it: after a crash the
learner resumes with exactly the batches that its restored model has not
seen; batches it consumed after its last checkpoint are consumed again,
because their effect on the model was lost with the crash.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.rundir import atomic_write, write_json
from rl.store.rollouts import Cursor
from rl.store.zgroup import sweep_temporaries, temporary_name


@dataclass
class Checkpoint:
    step: int
    cursor: Cursor
    meta: dict[str, Any]
    path: Path


class LearnerCheckpoints:
    def __init__(self, run_dir: str | os.PathLike[str], role: str = "learner"):
        self.folder = Path(run_dir) / "checkpoints" / role

    def save(
        self,
        step: int,
        cursor: Cursor,
        meta: dict[str, Any] | None = None,
        write_payload: Callable[[Path], None] | None = None,
        keep: int = 2,
    ) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"step-{step:010d}"
        if (final / "meta.json").exists():
            raise FileExistsError(f"{final}: checkpoint of step {step} exists")
        tmp = temporary_name(final)
        tmp.mkdir()
        try:
            if write_payload is not None:
                write_payload(tmp)
            write_json(tmp / "cursor.json", cursor.to_json())
            write_json(tmp / "meta.json", {"step": step, **(meta or {})})
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic_write(self.folder / "LATEST", final.name + "\n")
        for old in self._complete()[:-keep]:
            shutil.rmtree(self.folder / old, ignore_errors=True)
        sweep_temporaries(self.folder)
        return final

    def _complete(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted(
            p.name for p in self.folder.iterdir() if p.name.startswith("step-") and (p / "meta.json").exists()
        )

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint. The rename into place is the commit:
        LATEST, written after it, may lag by one (a crash between the two) and
        is only a pointer for people and tools."""
        complete = self._complete()
        if not complete:
            return None
        path = self.folder / complete[-1]
        meta = json.loads((path / "meta.json").read_text())
        return Checkpoint(meta["step"], Cursor.from_json(json.loads((path / "cursor.json").read_text())), meta, path)
