"""Committed Zarr groups: the one write primitive of the store.

A committed group is a folder that is a valid Zarr v3 group of uncompressed
arrays (one chunk each), plus `_COMMIT.json`, written last, which lists every
array with its dtype, shape and xxh3-64 checksum. It is built under a private
temporary name next to its final name and renamed into place in one step:

  * a reader never sees a half-written group (it ignores dot-names, and
    requires the marker);
  * a second writer of the same name loses the rename and learns that the
    group already exists: that is how writes are made idempotent;
  * a writer killed mid-way leaves only a dot-named folder, which
    `rl.fsio.sweep_temporaries` removes.

Metadata (`zarr.json`) is produced by zarr itself, so `zarr.open_group` reads
every group the store writes (a test checks it). Chunk bytes move with plain
file I/O straight from and into array memory, without the copies that
zarr's codec pipeline makes: that is what brings the store near disk speed.
Files per group: 1 (group zarr.json) + 2 per array (zarr.json, chunk `c.0`)
+ 1 marker, in 1 + 1 per array folders.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from rl.errors import SarlError
from rl.fsio import CorruptFile, commit_dir, read_json

MARKER = "_COMMIT.json"


class StoreError(SarlError, RuntimeError):
    """Base of the store's errors."""


class CorruptData(StoreError):
    """Stored bytes do not match their checksum, a file is missing, or one
    cannot be read as what it should be; the message names it."""


@dataclass(frozen=True)
class Damage:
    """An entry of the store that was skipped as damaged."""

    path: str
    reason: str


def checksum(buf: Any) -> str:
    """xxh3-64 of a buffer (about 35 GB/s here), as 16 hex digits."""
    return xxhash.xxh3_64_hexdigest(memoryview(buf).cast("B"))


# ------------------------------------------------------------- zarr metadata


@functools.lru_cache(maxsize=64)
def _template(dtype: str) -> str:
    import zarr

    # "." separator: chunk files sit beside zarr.json (c.0), no folder per array's chunks
    arr = zarr.create_array(
        zarr.storage.MemoryStore(),
        shape=(1,),
        chunks=(1,),
        dtype=dtype,
        compressors=None,
        filters=None,
        fill_value=0,
        chunk_key_encoding={"name": "default", "separator": "."},
    )
    return json.dumps(arr.metadata.to_dict())


def array_metadata(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """zarr.json of an uncompressed little-endian array stored as one chunk."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.metadata.v3 import ArrayV3Metadata

    meta = json.loads(_template(np.dtype(dtype).str.lstrip("<|=")))
    meta["shape"] = list(shape)
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [max(1, s) for s in shape] or []
    out: bytes = ArrayV3Metadata.from_dict(meta).to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes()
    return out


@functools.lru_cache(maxsize=1)
def _group_metadata() -> bytes:
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.group import GroupMetadata

    out: bytes = GroupMetadata().to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes()
    return out


def group_metadata(attrs: dict[str, Any]) -> bytes:
    if not attrs:
        return _group_metadata()
    meta = json.loads(_group_metadata())
    meta["attributes"] = attrs
    return json.dumps(meta, separators=(",", ":")).encode()


def chunk_key(ndim: int) -> str:
    """File name of the only chunk of an array of `ndim` dimensions."""
    return ".".join(["c"] + ["0"] * ndim)


# ------------------------------------------------------------------ writing


def _write_file(path: Path, data: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data).cast("B")
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)


def _as_le(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a


def write_group(tmp: Path, arrays: dict[str, np.ndarray], attrs: dict[str, Any], marker: dict[str, Any]) -> None:
    """Write a group into the new, empty folder `tmp`; the marker last."""
    _write_file(tmp / "zarr.json", group_metadata(attrs))
    listing = {}
    for name, a in arrays.items():
        a = _as_le(a)
        folder = tmp / name
        folder.mkdir()
        _write_file(folder / "zarr.json", array_metadata(a.dtype, a.shape))
        _write_file(folder / chunk_key(a.ndim), a)
        listing[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "xxh3": checksum(a)}
    _write_file(tmp / MARKER, json.dumps({**marker, "arrays": listing, "committed_at": time.time()}).encode())


def write_committed(
    final: Path,
    arrays: dict[str, np.ndarray],
    attrs: dict[str, Any] | None = None,
    marker: dict[str, Any] | None = None,
) -> bool:
    """Write and commit a group at `final` (rl.fsio.commit_dir). False if it was already committed."""
    return commit_dir(final, lambda tmp: write_group(tmp, arrays, attrs or {}, marker or {}), marker=MARKER)


# ------------------------------------------------------------------ reading


def read_json_file(path: Path) -> Any:
    """A JSON file of the store, or None when missing; CorruptData naming the
    file when it cannot be read (empty, torn, not JSON)."""
    try:
        return read_json(path)
    except CorruptFile as e:
        raise CorruptData(str(e)) from None


def read_marker(group: Path) -> dict[str, Any] | None:
    """The commit marker of a group, or None when it has none. A marker that
    is not a JSON object with its `arrays` listing raises CorruptData."""
    data = read_json_file(group / MARKER)
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("arrays"), dict):
        raise CorruptData(f"{group / MARKER}: not a commit marker")
    return data


def read_attributes(group: Path) -> dict[str, Any]:
    """The `attributes` of a group's zarr.json; CorruptData naming the file otherwise."""
    meta = read_json_file(group / "zarr.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("attributes"), dict):
        raise CorruptData(f"{group / 'zarr.json'}: not a Zarr group with attributes")
    attrs: dict[str, Any] = meta["attributes"]
    return attrs


def map_chunk(path: Path) -> memoryview:
    """The bytes of a chunk file, memory-mapped copy-on-write (writable, lazy)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return memoryview(bytearray())
        return memoryview(mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))


def read_array(group: Path, name: str, info: dict[str, Any], verify: bool = True) -> np.ndarray:
    """One array of a committed group, as listed in its marker."""
    shape = tuple(info["shape"])
    dtype = np.dtype(info["dtype"])
    path = group / name / chunk_key(len(shape))
    try:
        if int(np.prod(shape)) * dtype.itemsize < 1 << 16:
            raw: Any = path.read_bytes()  # small: one read beats a mapping
        else:
            raw = map_chunk(path)
    except FileNotFoundError:
        raise CorruptData(f"{path}: chunk file missing") from None
    if len(raw) != int(np.prod(shape)) * dtype.itemsize:
        raise CorruptData(f"{path}: {len(raw)} bytes, expected {int(np.prod(shape)) * dtype.itemsize}")
    if verify and checksum(raw) != info["xxh3"]:
        raise CorruptData(f"{group / name}: checksum mismatch")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def read_group(group: Path, verify: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """All arrays of a committed group and its marker."""
    marker = read_marker(group)
    if marker is None:
        raise StoreError(f"{group}: not committed")
    try:
        return {n: read_array(group, n, i, verify) for n, i in marker["arrays"].items()}, marker
    except (KeyError, TypeError, ValueError) as e:  # a marker whose listing is not what was written
        raise CorruptData(f"{group / MARKER}: bad array listing ({type(e).__name__}: {e})") from None
