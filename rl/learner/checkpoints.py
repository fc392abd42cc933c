"""Learner checkpoints: model state plus the rollout cursor, committed together.

    checkpoints/learner/step-<step:010d>/   one complete checkpoint
        cursor.json                         the consumed rollout batches
        meta.json                           step, weight version, RNG, ..., and the
                                            size and xxh3 hash of every payload file
                                            (written last)
        ...                                 whatever the learner writes (DeepSpeed files)
    checkpoints/learner/LATEST              name of the newest complete one (a pointer)

A checkpoint is built under a temporary name and renamed into place: that
rename commits it. LATEST is written after it, so it can lag by one after a
crash; the newest complete checkpoint, not LATEST, is what resumes. The cursor travels inside it: after a crash the
learner resumes with exactly the batches that its restored model has not
seen; batches it consumed after its last checkpoint are consumed again,
because their effect on the model was lost with the crash.

`damage()` checks a checkpoint's payload against the sizes and hashes its
meta recorded (a torn write, a file lost or changed on the filesystem)
before any rank loads it: one process decides from the files alone, so
several ranks agree on falling back to the checkpoint before it. Hashing
reads the payload once more at each save and at resume (xxh3: a few GB/s).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from rl.fsio import CorruptFile, atomic_write, commit_dir, read_json, sweep_temporaries, write_json
from rl.layout import RunLayout
from rl.store.cursor import Cursor
from rl.store.zgroup import StoreError


@dataclass
class Checkpoint:
    step: int
    cursor: Cursor
    meta: dict[str, Any]
    path: Path


class LearnerCheckpoints:
    def __init__(self, run_dir: str | os.PathLike[str], role: str = "learner"):
        self.folder = RunLayout(run_dir).checkpoints(role)
        self.skipped: list[tuple[str, str]] = []
        """Checkpoints the last `latest()` passed over: (path, reason)."""

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

        def build(tmp: Path) -> None:
            if write_payload is not None:
                write_payload(tmp)
            files = manifest(tmp)
            write_json(tmp / "cursor.json", cursor.to_json())
            write_json(tmp / "meta.json", {"step": step, **(meta or {}), "files": files})

        if not commit_dir(final, build):
            raise FileExistsError(f"{final}: checkpoint of step {step} exists")
        atomic_write(self.folder / "LATEST", final.name + "\n")
        for old in self._complete()[:-keep]:
            shutil.rmtree(self.folder / old, ignore_errors=True)
        sweep_temporaries(self.folder)
        return final

    def damage(self, ck: Checkpoint) -> str:
        """Why `ck`'s payload is not what was written (empty: it is): the
        first file missing, of another size, or with another hash. A
        checkpoint whose meta has no manifest (older sarl) is not checked."""
        for rel, (size, digest) in sorted(ck.meta.get("files", {}).items()):
            path = ck.path / rel
            try:
                now = path.stat().st_size
                if now != size:
                    return f"{rel}: {now} bytes, {size} when written"
                if file_hash(path) != digest:
                    return f"{rel}: its content changed since it was written (xxh3 {digest})"
            except OSError as e:
                return f"{rel}: {type(e).__name__}: {e.strerror or e}"
        return ""

    def _complete(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted(
            p.name for p in self.folder.iterdir() if p.name.startswith("step-") and (p / "meta.json").exists()
        )

    def set_aside(self, path: Path, why: str) -> Path:
        """Take a checkpoint that cannot be loaded out of the running: renamed
        `bad-step-...` (kept for a person to look at, never pruned or read
        again), with its reason in `why.txt`. `latest()` then finds the one
        before it."""
        target = self.folder / f"bad-{path.name}"
        n = 1
        while target.exists():
            n += 1
            target = self.folder / f"bad-{path.name}.{n}"
        path.rename(target)
        (target / "why.txt").write_text(why + "\n")
        return target

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint that can be read. The rename into
        place is the commit: LATEST, written after it, may lag by one (a crash
        between the two) and is only a pointer for people and tools. A
        checkpoint whose meta or cursor is unreadable is passed over for the
        one before it, and named in `self.skipped` (path, reason)."""
        self.skipped = []
        for name in reversed(self._complete()):
            path = self.folder / name
            try:
                meta = read_json(path / "meta.json")
                cursor = Cursor.from_json(read_json(path / "cursor.json"))
                return Checkpoint(int(meta["step"]), cursor, meta, path)
            except (CorruptFile, StoreError, KeyError, TypeError, ValueError) as e:
                self.skipped.append((str(path), f"unreadable learner checkpoint: {e}"))
        return None


def file_hash(path: Path) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def manifest(folder: Path) -> dict[str, list[Any]]:
    """Every file under `folder`: relative path -> [size, xxh3 hash]."""
    return {
        str(p.relative_to(folder)): [p.stat().st_size, file_hash(p)] for p in sorted(folder.rglob("*")) if p.is_file()
    }
