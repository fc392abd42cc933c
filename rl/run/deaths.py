"""Recovery's record of each task: its deaths, and whether it is given up.

    RUN/recovery/ROLE/task-NNNNNN.json   {"deaths": [{job_id, at, reason}],
                                          "given_up": why, ...}

The recovery round (rl.run.recovery) writes it under the run's lock;
`sarl status` reads why a task is not restarted; `sarl resume` clears it,
so that a person's restart starts a crash loop's count again.
"""

from __future__ import annotations

from pathlib import Path

from rl.fsio import read_json
from rl.layout import RunLayout


def record_path(rd: RunLayout, role: str, task: int) -> Path:
    return rd.recovery(role) / f"task-{task:06d}.json"


def given_up(rd: RunLayout, role: str, task: int) -> str:
    """Why the watchers no longer start this task (empty: they do)."""
    rec = read_json(record_path(rd, role, task)) or {}
    return str(rec.get("given_up", ""))


def clear(rd: RunLayout, role: str, tasks: list[int]) -> None:
    """A person resubmitted these tasks (`sarl resume`): their deaths so far no longer count."""
    for t in tasks:
        record_path(rd, role, t).unlink(missing_ok=True)
