"""The run's quarantine: tasks that no rollout worker may draw.

    RUN/quarantine/<hash of the task id>.json   {task_id, reason, by, at}

One file per task, written atomically, so that several workers and the
user (`sarl tasks quarantine RUN_DIR TASK_ID --reason ...`) add entries
with no lock and no lost update. An entry is never removed by sarl; delete
its file to let a task back in (workers read the folder again every few
seconds).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from rl.fsio import CorruptFile, read_json, write_json

FOLDER = "quarantine"


def _path(run_dir: str | os.PathLike[str], task_id: str) -> Path:
    return Path(run_dir) / FOLDER / (hashlib.sha256(task_id.encode()).hexdigest()[:24] + ".json")


def quarantine(run_dir: str | os.PathLike[str], task_id: str, reason: str, by: str) -> bool:
    """Quarantine `task_id`; False when it already was (the first reason stands)."""
    path = _path(run_dir, task_id)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"task_id": task_id, "reason": reason, "by": by, "at": time.time()})
    return True


def quarantined(run_dir: str | os.PathLike[str], task_ids: list[str] | None = None) -> dict[str, str]:
    """The quarantined task ids, with their reasons; with `task_ids`, those
    of them. Entries are matched by file name, so an unreadable entry still
    keeps its task out (its reason says that it is unreadable)."""
    folder = Path(run_dir) / FOLDER
    if not folder.is_dir():
        return {}
    names = {f.name for f in folder.glob("*.json")}
    out: dict[str, str] = {}
    if task_ids is None:
        for name in sorted(names):
            entry = _read(folder / name)
            if "task_id" in entry:
                out[str(entry["task_id"])] = str(entry.get("reason", ""))
        return out
    for tid in task_ids:
        path = _path(run_dir, tid)
        if path.name in names:
            out[tid] = str(_read(path).get("reason", ""))
    return out


def _read(path: Path) -> dict[str, object]:
    try:
        entry = read_json(path)
    except CorruptFile as e:
        return {"reason": f"unreadable quarantine entry: {e}"}
    return entry if isinstance(entry, dict) else {"reason": f"unreadable quarantine entry: {path}"}
