"""Atomic files and committed folders: the one way sarl commits anything to
disk. Standard library only, so that every layer (the store inside vLLM's
worker, the login node's CLI) can use it.

A writer builds under a private temporary name beside the target (a dot-name
with `.tmp-`), fsyncs what it wrote, and commits with one rename, then fsyncs
the parent folder so that the rename itself survives a crash. A reader sees
the old content or the new one, never a torn write; a writer killed mid-way
leaves only a dot-named temporary, which `sweep_temporaries` removes.

What this does not cover: a filesystem whose rename is not atomic (some
object-store FUSE mounts), and readers that cache directory listings longer
than the writer's rename (NFS attribute caching): those see the commit late,
never half of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl.errors import SarlError

__all__ = [
    "CorruptFile",
    "atomic_write",
    "commit_dir",
    "read_json",
    "sweep_temporaries",
    "temporary_name",
    "write_json",
]


class CorruptFile(SarlError, ValueError):
    """A file that exists but cannot be read as what it should be; the message names it."""


def temporary_name(final: Path) -> Path:
    """A private name beside `final` that no reader takes for a committed entry."""
    return final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:12]}"


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            _fsync_file(Path(folder) / name)
        _fsync_dir(Path(folder))


def atomic_write(path: Path, data: str | bytes) -> None:
    """Replace the file `path` with `data`, through a temporary file and one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with open(tmp, "xb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def commit_dir(final: Path, build: Callable[[Path], None], marker: str | None = None) -> bool:
    """Build the folder `final` with `build(tmp)` under a temporary name, then
    commit it with one rename. True when this call committed it; False when
    `final` already existed (another writer committed first), in which case
    nothing of this call is left behind. Any error removes the temporary
    folder and propagates. `build` receives a folder that exists and is empty.

    Before the rename every file is fsynced; or, with `marker` (the file,
    written last, that lists checksums of everything else, as in the store),
    only that file and the folder: a crash can then leave torn data under a
    durable marker, which the checksums tell on read, but never a torn or
    empty marker. Syncing every file of a rollout batch halved the store's
    write speed here (docs/benchmarks.md)."""
    if final.exists():
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(final)
    tmp.mkdir()
    try:
        build(tmp)
        if marker is None:
            _fsync_tree(tmp)
        else:
            _fsync_file(tmp / marker)
            _fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if final.exists():  # lost the race: the other writer's folder stands
                shutil.rmtree(tmp, ignore_errors=True)
                return False
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(final.parent)
    return True


def sweep_temporaries(folder: Path, older_than_s: float = 0.0) -> int:
    """Remove temporaries (and folders being deleted) that dead writers left in `folder`."""
    if not folder.is_dir():
        return 0
    n = 0
    now = time.time()
    for p in folder.iterdir():
        if p.name.startswith(".") and (".tmp-" in p.name or ".deleting-" in p.name):
            with contextlib.suppress(FileNotFoundError):
                if now - p.stat().st_mtime >= older_than_s:
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink()
                    n += 1
    return n


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    """The content of a JSON file, or None when it does not exist. A file that
    exists but is not JSON (a torn copy, a full disk) raises `CorruptFile`
    naming it, never a bare decoding error."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        why = "empty" if not raw.strip() else f"not JSON ({e})"
        raise CorruptFile(f"{path}: {why}") from None
