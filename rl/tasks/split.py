"""Train / held-out splits that hold out whole templates (or families),
never single tasks: a task held out while a sibling of its template is
trained on measures recall, not learning.

    units   = the tasks grouped by template (rl.tasks.leakage.template) or family
    held    = per family, a seeded shuffle of its units, taken while the
              family's held-out share is below the fraction (a family with
              one unit stays on the training side); by family: the families
    then    held-out tasks that still leak (the same reference program, or a
              near-duplicate prompt, under another template) move to the
              training side, counted, so that the final check finds nothing

Deterministic: the same file, fraction and seed give the same split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from rl.errors import SarlError
from rl.tasks.format import Task
from rl.tasks.leakage import LeakReport, find_leaks, template


class SplitError(SarlError, ValueError):
    """A split that cannot be made; the message says why."""

    exit_code = 2


@dataclass
class Split:
    train: list[Task]
    held: list[Task]
    units: int
    """Templates (or families) in the file."""
    held_units: int
    moved: int
    """Held-out tasks moved to the training side because they still leaked."""
    leaks: LeakReport
    """The final check: empty."""


def _unit(task: Task, by: str) -> str:
    return str(task.metadata.get("family", "")) if by == "family" else template(task)


def split_tasks(tasks: list[Task], held_out: float, seed: int, by: Literal["template", "family"] = "template") -> Split:
    if not 0.0 < held_out < 1.0:
        raise SplitError(f"--held-out {held_out}: a fraction strictly between 0 and 1")
    units: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        units.setdefault(_unit(t, by), []).append(i)
    if len(units) < 2:
        raise SplitError(
            f"the {len(tasks)} tasks have {len(units)} {by}: a {by}-disjoint split needs at least 2 "
            "(tasks of one template held out from each other measure recall, not learning)"
        )
    families: dict[str, list[str]] = {}
    for key, idx in units.items():
        fam = "" if by == "family" else str(tasks[idx[0]].metadata.get("family", ""))
        families.setdefault(fam, []).append(key)
    chosen: set[str] = set()
    for fam, keys in sorted(families.items()):
        order = sorted(keys)
        random.Random(f"{seed}/split/{by}/{fam}").shuffle(order)
        total = sum(len(units[k]) for k in order)
        held = 0
        for k in order[:-1]:  # the last unit of a family always trains
            if held + len(units[k]) / 2 >= held_out * total:  # taking it would not bring the share closer
                break
            chosen.add(k)
            held += len(units[k])
    held_ids = {tasks[i].task_id for k in chosen for i in units[k]}
    moved: set[str] = set()
    while True:  # a moved task can make another held-out one leak through it: until none does
        train = [t for t in tasks if t.task_id not in held_ids]
        held_tasks = [t for t in tasks if t.task_id in held_ids]
        report = find_leaks(train, held_tasks)
        if not report.leaks or not held_tasks:
            break
        moved |= report.leaking
        held_ids -= report.leaking
    if not train or not held_tasks:
        raise SplitError(
            f"--held-out {held_out} of {len(tasks)} tasks in {len(units)} {by} units leaves one side empty "
            "once whole units are held out and leaking tasks moved; give a larger fraction or more varied tasks"
        )
    return Split(train, held_tasks, len(units), len({_unit(t, by) for t in held_tasks}), len(moved), report)
