"""Weight versions: published by the learner, loaded by generators.

Layout: `store.zarr/weights/v<version:010d>/`, a Zarr v3 group with one array
`data` (uint8, one chunk): the bytes of the tensors this version stores,
each at a 64-byte-aligned offset. `manifest.json`, written last, lists every
tensor of the version with its dtype, shape, the version whose blob holds
its bytes, offset, length and xxh3-64 checksum. The folder is built under a
temporary name and renamed into place: a loader never sees half a version.

bf16 (which Zarr has no dtype for) is stored as raw 2-byte words; the
manifest says `bfloat16`. Delta versions store only the tensors whose bytes
changed since the previous version and point at older blobs for the rest; a
full version is written every `full_every` versions, so that old blobs can be
dropped. Files per version: 4 (group and array zarr.json, the chunk, the
manifest).

Retention keeps the newest `keep_last` versions, pinned ones (`pin()`: a
generator, `sarl eval` or `sarl serve` that is loading one), and every
version whose blob a kept version points into. A pin whose holder died
before it unpinned (SIGKILL, a lost node) would keep its version for the
rest of the run: a pin whose process is gone from this host, or that is
older than `PIN_LEASE_S` (a load takes minutes; another host's process
cannot be looked up), holds nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from rl.fsio import atomic_write, commit_dir, sweep_temporaries
from rl.lifetime import gone
from rl.store.zgroup import (
    CorruptData,
    Damage,
    StoreError,
    array_metadata,
    checksum,
    chunk_key,
    group_metadata,
    map_chunk,
    read_json_file,
)

MANIFEST = "manifest.json"
ALIGN = 64
DTYPES = ("bfloat16", "float16", "float32")


class UnknownVersion(StoreError, KeyError):
    """A weight version that is not committed in the store."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Published:
    version: int
    kind: str
    """"full" or "delta"."""
    written_tensors: int
    written_bytes: int
    committed: bool
    """False when this version was already committed (nothing was written)."""


def _torch() -> Any:
    import torch

    return torch


def _raw(t: Any) -> np.ndarray:
    """The bytes of a contiguous CPU tensor, without a copy."""
    torch = _torch()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().reshape(-1).view(np.uint8)


PIN_LEASE_S = 6 * 3600
"""How long a pin holds its version when its holder cannot be seen to be alive."""


def pin_is_stale(pin: Mapping[str, Any], now: float) -> bool:
    """Whether a pin's holder is gone: its process, on this host, is not
    running, or the pin outlived the lease. (A pid reused since is taken for
    the holder until the lease ends.) Pins written before pins named their
    process hold as long as they exist."""
    if gone(pin.get("host"), pin.get("pid")):
        return True
    at = pin.get("at")
    return isinstance(at, (int, float)) and now - at > PIN_LEASE_S


class WeightStore:
    """Publishing, loading, pinning and retention of weight versions."""

    def __init__(self, store: str | os.PathLike[str]):
        self.folder = Path(store) / "weights"
        self.pins = self.folder / "pins"
        self.damaged: list[Damage] = []
        """Pin files the last `pinned()` could not read."""
        self.stale: list[str] = []
        """Holders whose pins the last `pinned()` found stale (`pin_is_stale`)."""

    # ---------------------------------------------------------------- listing
    def path(self, version: int) -> Path:
        return self.folder / f"v{version:010d}"

    def versions(self) -> list[int]:
        """Committed versions, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(
            int(p.name[1:])
            for p in self.folder.iterdir()
            if p.name.startswith("v") and p.name[1:].isdigit() and (p / MANIFEST).exists()
        )

    def latest(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def _resolve(self, version: int | None) -> int:
        """`version`, or the latest committed one."""
        if version is None:
            version = self.latest()
            if version is None:
                raise UnknownVersion("no weight version is committed yet")
        return version

    def manifest(self, version: int) -> dict[str, Any]:
        """The manifest of `version`: UnknownVersion when it is not committed,
        CorruptData (naming the file) when it cannot be read."""
        path = self.path(version) / MANIFEST
        data = read_json_file(path)
        if data is None:
            have = self.versions()
            span = f"{have[0]}..{have[-1]}" if have else "none"
            raise UnknownVersion(f"weight version {version} is not committed (committed: {span})")
        if not isinstance(data, dict) or not isinstance(data.get("tensors"), dict) or "kind" not in data:
            raise CorruptData(f"{path}: not a weight manifest")
        for name, e in data["tensors"].items():
            if not isinstance(e, dict) or not {"dtype", "shape", "nbytes", "xxh3", "stored_in", "offset"} <= set(e):
                raise CorruptData(f"{path}: tensor {name!r} is not described whole")
        return data

    def adapter(self, version: int) -> dict[str, Any] | None:
        """The adapter record of `version` (rank, alpha, scale) when it holds
        LoRA adapters (rl.engine.lora), None when it holds weights."""
        record = self.manifest(version).get("adapter")
        if record is not None and not (isinstance(record, dict) and isinstance(record.get("scale"), int | float)):
            raise CorruptData(f"{self.path(version) / MANIFEST}: its adapter record has no scale")
        return record

    # ---------------------------------------------------------------- publish
    def publish(
        self,
        state_dict: Mapping[str, Any],
        version: int | None = None,
        dtype: str | None = "bfloat16",
        full_every: int = 10,
        changed: Collection[str] | None = None,
        adapter: Mapping[str, Any] | None = None,
    ) -> Published:
        """Publish `state_dict` as `version` (default: latest + 1). Floating
        tensors are stored as `dtype` (None: as they are). Publishing a
        version that is already committed writes nothing.

        A delta version finds the changed tensors by checksum. A learner that
        knows which tensors it trains (LoRA, frozen layers) passes their names
        as `changed`: the others are then taken from the previous version
        without being read, which makes a small delta much cheaper. A wrong
        `changed` publishes stale tensors: pass it only when it is certain."""
        torch = _torch()
        if dtype is not None and dtype not in DTYPES:
            raise StoreError(f"dtype {dtype!r}: expected one of {DTYPES}")
        if full_every < 1:
            raise StoreError(f"full_every must be >= 1, got {full_every}")
        latest = self.latest()
        version = (latest + 1 if latest is not None else 0) if version is None else version
        if version < 0:
            raise StoreError(f"version must be >= 0, got {version}")
        if (self.path(version) / MANIFEST).exists():
            m = self.manifest(version)
            return Published(version, m["kind"], 0, 0, committed=False)
        if latest is not None and version < latest:
            raise StoreError(f"version {version} is older than the latest committed version {latest}")
        prev = self.manifest(latest) if latest is not None else None
        kind = "delta" if prev is not None and prev["deltas_since_full"] + 1 < full_every else "full"

        tensors: dict[str, Any] = {}
        entries: dict[str, dict[str, Any]] = {}
        for name, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                raise StoreError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            t = t.detach()
            if dtype is not None and t.is_floating_point():
                t = t.to(getattr(torch, dtype))
            t = tensors[name] = t.cpu().contiguous()
            e = entries[name] = {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "nbytes": t.nbytes,
            }
            old = prev["tensors"].get(name) if (prev is not None and kind == "delta") else None
            if (
                changed is not None
                and name not in changed
                and old is not None
                and old["dtype"] == e["dtype"]
                and old["shape"] == e["shape"]
            ):
                e["xxh3"] = old["xxh3"]  # unchanged, on the caller's word: not read
            else:
                e["xxh3"] = checksum(_raw(t))

        to_write = []
        offset = 0
        for name, e in entries.items():
            old = prev["tensors"].get(name) if (prev is not None and kind == "delta") else None
            if old is not None and all(old[k] == e[k] for k in ("dtype", "shape", "xxh3")):
                e.update(stored_in=old["stored_in"], offset=old["offset"])
                continue
            e.update(stored_in=version, offset=offset)
            to_write.append(name)
            offset += -(-e["nbytes"] // ALIGN) * ALIGN
        manifest = {
            "version": version,
            "kind": kind,
            "created_at": time.time(),
            "deltas_since_full": 0 if kind == "full" else prev["deltas_since_full"] + 1,  # type: ignore[index]
            "blob_bytes": offset,
            "tensors": entries,
        }
        if adapter is not None:
            manifest["adapter"] = dict(adapter)

        def build(tmp: Path) -> None:
            self._write_blob(tmp, [(_raw(tensors[n]), entries[n]["offset"]) for n in to_write], offset)
            (tmp / MANIFEST).write_text(json.dumps(manifest))

        if not commit_dir(self.path(version), build, marker=MANIFEST):  # a concurrent publisher committed first
            return Published(version, kind, 0, 0, committed=False)
        return Published(version, kind, len(to_write), offset, committed=True)

    @staticmethod
    def _write_blob(tmp: Path, parts: list[tuple[np.ndarray, int]], size: int) -> None:
        (tmp / "zarr.json").write_bytes(group_metadata({"sarl": "weights"}))
        (tmp / "data").mkdir()
        (tmp / "data" / "zarr.json").write_bytes(array_metadata(np.dtype(np.uint8), (size,)))
        chunk = tmp / "data" / chunk_key(1)
        fd = os.open(chunk, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            pos = 0
            for raw, offset in parts:
                if offset > pos:
                    os.write(fd, bytes(offset - pos))
                view = memoryview(raw.data)
                while view:
                    view = view[os.write(fd, view) :]
                pos = offset + raw.nbytes
            if size > pos:
                os.write(fd, bytes(size - pos))
        finally:
            os.close(fd)

    # ------------------------------------------------------------------- load
    def load(self, version: int | None = None, verify: bool = True) -> tuple[int, dict[str, Any]]:
        """(version, tensors) of `version` (default: the latest). Tensors are
        backed by copy-on-write mappings of the stored files: writable, and
        read from disk only when touched (`verify` touches every byte)."""
        torch = _torch()
        version = self._resolve(version)
        manifest = self.manifest(version)
        blobs: dict[int, memoryview] = {}
        out = {}
        for name, e in manifest["tensors"].items():
            raw = self._bytes(blobs, version, name, e)
            if verify and checksum(raw) != e["xxh3"]:
                raise CorruptData(f"version {version}: {name}: checksum mismatch (stored in version {e['stored_in']})")
            dt = getattr(torch, e["dtype"])
            t = torch.frombuffer(raw, dtype=dt) if e["nbytes"] else torch.empty(0, dtype=dt)
            out[name] = t.view(e["shape"])
        return version, out

    def load_into(
        self, target: Mapping[str, Any], version: int | None = None, verify: bool = True, piece: int = 4 << 20
    ) -> int:
        """Copy `version` (default: the latest) into the tensors of `target`
        (a live model's state dict), verifying every checksum on the way: each
        piece is hashed, then copied while it is still in cache (`verify=False`
        skips the checksums: only for data verified before). Raises if a
        tensor is corrupt, missing or mis-shaped; the target may then hold a
        mix of versions, and must be loaded again."""
        torch = _torch()
        version = self._resolve(version)
        manifest = self.manifest(version)
        missing = sorted(set(target) - set(manifest["tensors"]))
        extra = sorted(set(manifest["tensors"]) - set(target))
        if missing or extra:
            raise StoreError(
                f"version {version} does not match the target: not in the version {missing[:5]}, "
                f"not in the target {extra[:5]}"
            )
        blobs: dict[int, memoryview] = {}
        for name, e in manifest["tensors"].items():
            dst = target[name]
            if list(dst.shape) != e["shape"] or str(dst.dtype).removeprefix("torch.") != e["dtype"]:
                raise StoreError(
                    f"version {version}: {name} is {e['dtype']}{e['shape']}, "
                    f"the target's is {str(dst.dtype).removeprefix('torch.')}{list(dst.shape)}"
                )
            raw = self._bytes(blobs, version, name, e)
            if not e["nbytes"]:
                continue
            src_bytes = torch.frombuffer(raw, dtype=torch.uint8)
            dst_bytes = dst.view(-1).view(torch.uint8)
            if not verify:
                dst_bytes.copy_(src_bytes)
                continue
            h = xxhash.xxh3_64()
            for a in range(0, e["nbytes"], piece):
                b = min(e["nbytes"], a + piece)
                h.update(raw[a:b])
                dst_bytes[a:b].copy_(src_bytes[a:b])
            if h.hexdigest() != e["xxh3"]:
                raise CorruptData(f"version {version}: {name}: checksum mismatch (stored in version {e['stored_in']})")
        return int(version)

    def _bytes(self, blobs: dict[int, memoryview], version: int, name: str, e: dict[str, Any]) -> memoryview:
        """The stored bytes of one tensor of `version` (blobs mapped once each)."""
        src = e["stored_in"]
        if src not in blobs:
            try:
                blobs[src] = map_chunk(self.path(src) / "data" / chunk_key(1))
            except FileNotFoundError:
                raise CorruptData(f"version {version}: {name} is stored in version {src}, which is gone") from None
        raw = blobs[src][e["offset"] : e["offset"] + e["nbytes"]]
        if len(raw) != e["nbytes"]:
            raise CorruptData(f"version {version}: {name}: blob of version {src} is truncated")
        return raw

    # -------------------------------------------------------- pins, retention
    def pin(self, holder: str, version: int) -> None:
        """Keep `version` (and what it points into) while `holder` needs it."""
        self.manifest(version)  # must exist
        pin = {"version": version, "at": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
        atomic_write(self.pins / f"{holder}.json", json.dumps(pin))

    def unpin(self, holder: str) -> None:
        (self.pins / f"{holder}.json").unlink(missing_ok=True)

    @contextlib.contextmanager
    def pinned_while(self, holder: str, version: int) -> Iterator[None]:
        """Keep `version` from retention while the block (a load) runs."""
        self.pin(holder, version)
        try:
            yield
        finally:
            self.unpin(holder)

    def pinned(self) -> dict[str, int]:
        """holder -> pinned version, of the pins whose holders live. A pin
        file that cannot be read is listed in `self.damaged`; while one
        exists, `retain` deletes nothing. Stale pins are listed in
        `self.stale` and left in place (their holder's name may be pinned
        again, by a restarted generator task)."""
        self.damaged, self.stale = [], []
        if not self.pins.is_dir():
            return {}
        out = {}
        now = time.time()
        for p in self.pins.glob("*.json"):
            try:
                data = read_json_file(p)
                if data is None:
                    continue  # unpinned meanwhile
                version = int(data["version"])
                if pin_is_stale(data, now):
                    self.stale.append(p.stem)
                    continue
                out[p.stem] = version
            except (StoreError, KeyError, TypeError, ValueError) as e:
                self.damaged.append(Damage(str(p), f"unreadable pin ({e}): every version is kept"))
        return out

    def retain(self, keep_last: int, also_keep: Iterable[int] = ()) -> list[int]:
        """Delete versions that are neither among the newest `keep_last`,
        pinned, in `also_keep`, nor pointed into by a kept version."""
        if keep_last < 1:
            raise StoreError(f"keep_last must be >= 1, got {keep_last}")
        versions = self.versions()
        pins = self.pinned()
        if self.damaged:  # a pin we cannot read may hold any version
            return []
        keep = set(versions[-keep_last:]) | set(pins.values()) | set(also_keep)
        for v in list(keep):
            if v in versions:
                try:
                    keep |= {e["stored_in"] for e in self.manifest(v)["tensors"].values()}
                except CorruptData:  # what it points into is unknown: keep everything older too
                    keep |= {u for u in versions if u <= v}
        dropped = [v for v in versions if v not in keep]
        for v in dropped:
            # out of sight in one rename, then removed
            doomed = self.folder / f".v{v:010d}.deleting-{uuid.uuid4().hex[:8]}"
            os.rename(self.path(v), doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        sweep_temporaries(self.folder, older_than_s=3600)
        return dropped
