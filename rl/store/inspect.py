"""`sarl store inspect RUN_DIR`: what the store holds, and what is consumed.

What is consumed is the learner's business: the caller passes the cursor of
its newest checkpoint, so that the store imports nothing above it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from rl.store import Store
from rl.store.cursor import Cursor
from rl.store.zgroup import Damage, StoreError, read_marker


def _tree(path: Path) -> tuple[int, int]:
    """(files, bytes) under a folder."""
    files = size = 0
    for root, _, names in os.walk(path):
        for n in names:
            files += 1
            with contextlib.suppress(FileNotFoundError):
                size += os.stat(os.path.join(root, n)).st_size
    return files, size


def inspect(
    store_path: Path, cursor: Cursor | None = None, checkpoint: str | None = None, damaged: list[Damage] | None = None
) -> dict[str, Any]:
    """What the store at `store_path` holds; batches in `cursor` count as
    consumed (by the learner checkpoint named `checkpoint`). Every damaged
    entry found on the way is listed under "damaged" with its reason (and
    the caller's own `damaged`, such as unreadable checkpoints)."""
    store = Store(store_path)
    damage: list[Damage] = list(damaged or [])
    weights = _weights(store, damage)
    rollouts = _rollouts(store, cursor, checkpoint, damage)
    return {
        "store": str(store.path),
        "weights": weights,
        "rollouts": rollouts,
        "damaged": [{"path": d.path, "reason": d.reason} for d in damage],
    }


def _weights(store: Store, damage: list[Damage]) -> dict[str, Any]:
    """The published versions: how many, of which kind, their bytes; an
    unreadable manifest goes to `damage`."""
    ws = store.weights
    versions = ws.versions()
    weights: dict[str, Any] = {"versions": len(versions), "pins": ws.pinned(), "stale_pins": ws.stale}
    damage += ws.damaged
    manifests = {}
    for v in versions:
        try:
            manifests[v] = ws.manifest(v)
        except StoreError as e:
            damage.append(Damage(str(ws.path(v)), str(e)))
    if versions:
        files, size = _tree(ws.folder)
        latest = manifests.get(versions[-1])
        weights.update(
            first=versions[0],
            latest=versions[-1],
            latest_readable=latest is not None,
            full=sum(m["kind"] == "full" for m in manifests.values()),
            delta=sum(m["kind"] == "delta" for m in manifests.values()),
            bytes=size,
            files_per_version=_tree(ws.path(versions[-1]))[0],
            latest_kind=latest["kind"] if latest else None,
            latest_tensors=len(latest["tensors"]) if latest else 0,
            latest_written=sum(e["stored_in"] == versions[-1] for e in latest["tensors"].values()) if latest else 0,
        )
    return weights


def _rollouts(store: Store, cursor: Cursor | None, checkpoint: str | None, damage: list[Damage]) -> dict[str, Any]:
    """The committed batches, what they hold, and how many `cursor` has
    consumed; a damaged batch goes to `damage`."""
    reader = store.reader()
    keys = reader.committed()
    damage += reader.damaged
    samples = tokens = 0
    per_writer: dict[str, int] = {}
    leftovers = []
    folder = store.path / "rollouts"
    for w, s in keys:
        m = read_marker(folder / w / f"{s:010d}") or {}
        samples += m.get("samples", 0)
        tokens += m.get("tokens", 0)
        per_writer[w] = per_writer.get(w, 0) + 1
    if folder.is_dir():
        for wdir in folder.iterdir():
            if wdir.is_dir():
                leftovers += [f"{wdir.name}/{p.name}" for p in wdir.iterdir() if p.name.startswith(".")]
    consumed = sum(1 for k in keys if cursor is not None and k in cursor)
    files, size = _tree(folder) if folder.is_dir() else (0, 0)
    return {
        "writers": len(per_writer),
        "batches": len(keys),
        "samples": samples,
        "tokens": tokens,
        "bytes": size,
        "files_per_batch": _tree(folder / keys[-1][0] / f"{keys[-1][1]:010d}")[0] if keys else 0,
        "consumed": consumed,
        "unconsumed": len(keys) - consumed,
        "checkpoint": checkpoint,
        "uncommitted_leftovers": leftovers,
        "given_up_groups": len(store.given_up.groups()),
    }


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def render(info: dict[str, Any]) -> str:
    w, r = info["weights"], info["rollouts"]
    lines = [f"store {info['store']}"]
    if w["versions"]:
        lines.append(
            f"weights   {w['versions']} versions (v{w['first']}..v{w['latest']}: "
            f"{w['full']} full, {w['delta']} delta), "
            f"{_size(w['bytes'])}, {w['files_per_version']} files per version"
        )
        lines.append(
            f"          latest v{w['latest']}: {w['latest_kind']}, {w['latest_written']} of "
            f"{w['latest_tensors']} tensors stored in it"
            if w["latest_readable"]
            else f"          latest v{w['latest']}: CANNOT BE READ (generators serve an older one)"
        )
    else:
        lines.append("weights   none published")
    if w["pins"]:
        lines.append("          pinned: " + ", ".join(f"{h} -> v{v}" for h, v in sorted(w["pins"].items())))
    lines.append(
        f"rollouts  {r['batches']} batches from {r['writers']} writers, {r['samples']:,} samples, "
        f"{r['tokens']:,} tokens, {_size(r['bytes'])}, {r['files_per_batch']} files per batch"
    )
    lines.append(
        f"          consumed {r['consumed']}, unconsumed {r['unconsumed']} "
        f"(learner checkpoint: {r['checkpoint'] or 'none'})"
    )
    if r["given_up_groups"]:
        lines.append(f"          groups given up: {r['given_up_groups']} (reasons: store.zarr/given_up/)")
    if r["uncommitted_leftovers"]:
        lines.append(
            f"          uncommitted leftovers of dead writers: {len(r['uncommitted_leftovers'])} "
            f"(swept when that writer restarts)"
        )
    if info["damaged"]:
        lines.append(f"DAMAGED   {len(info['damaged'])} entries skipped (the rest of the store is usable):")
        lines += [f"          {d['path']}: {d['reason']}" for d in info["damaged"]]
    return "\n".join(lines)
