"""A run folder's disk use, as `du` counts it, split by what holds it, and
whether its filesystem has room for the next learner checkpoint.

Sizes are allocated blocks (`st_blocks` x 512, what `du` reports), each
inode counted once however many links it has, folders included.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from rl.layout import RunLayout

PARTS = {
    "weights": ("store.zarr", "weights"),
    "rollouts": ("store.zarr", "rollouts"),
    "checkpoints": ("checkpoints",),
    "logs": ("logs",),
    "tensorboard": ("tb",),
}
"""Named parts of a run folder; everything else is `other`."""


def _du(root: Path, seen: set[tuple[int, int]]) -> int:
    total = 0
    for folder, dirs, files in os.walk(root):
        for name in (folder, *(os.path.join(folder, f) for f in files)):
            try:
                st = os.lstat(name)
            except FileNotFoundError:  # removed while we looked (retention, a sweep)
                continue
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                total += st.st_blocks * 512
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
    return total


def disk_use(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Bytes of the run folder in all (`total`, as `du -s`), of each part
    (PARTS, and `other`), the filesystem's `free` bytes, and `warning`: set
    when free space is below what the next learner checkpoint needs (the
    size of the newest one)."""
    root = Path(run_dir)
    seen: set[tuple[int, int]] = set()
    out: dict[str, Any] = {}
    for name, parts in PARTS.items():
        where = root.joinpath(*parts)
        out[name] = _du(where, seen) if where.is_dir() else 0
    out["total"] = sum(out.values()) + _du(root, seen)  # what is left is counted last: the rest
    out["other"] = out["total"] - sum(out[n] for n in PARTS)
    out["free"] = shutil.disk_usage(root).free
    newest = max(RunLayout(root).checkpoints("learner").glob("step-*"), default=None)
    need = _du(newest, set()) if newest is not None else 0
    out["next_checkpoint"] = need
    out["warning"] = (
        f"{human(out['free'])} free on the run's filesystem, less than the next learner checkpoint needs "
        f"({human(need)}): the learner will fail to save it"
        if need and out["free"] < need
        else ""
    )
    return out


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def render_disk(d: dict[str, Any]) -> str:
    parts = ", ".join(f"{n} {human(d[n])}" for n in (*PARTS, "other") if d.get(n))
    return f"disk: {human(d['total'])} ({parts}); {human(d['free'])} free"
