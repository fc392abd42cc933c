"""Which task each group plays: a queue shared by every worker, with no
coordinator.

Every worker reads the same facts from the run directory: the pass rate of
every task over all committed batches (every writer's), and the quarantine
(rl.tasks.quarantine). From them it draws the task of each group it starts:

    file      the task file furthest behind its share (`file_weights`) of
              the groups this worker has planned: fairness across files
    task      drawn in that file with probability proportional to
                  priority = p (1 - p) + 1 / sqrt(1 + n)
              n: samples of the task seen (committed by anyone, plus this
              worker's planned groups not committed yet); p: its pass rate,
              (passes + 1) / (n + 2). The second term puts under-sampled
              tasks first; the first puts informative ones next: p (1 - p)
              is largest where a group's rewards vary, and a group whose
              rewards are all equal teaches nothing.
    never     a quarantined task.

The draw is seeded by (run seed, group) and recorded in the worker's state
before any episode of the group starts, so that a group played again after
a kill plays the same task: an episode identity always means one task.
Two workers that read the store at the same moment draw independently (by
their different group numbers), so they rarely pile onto one task.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections import Counter
from pathlib import Path

from rl.store import Cursor, Store
from rl.store.zgroup import StoreError
from rl.tasks.format import Task, read_tasks
from rl.tasks.quarantine import quarantined


def priority(attempts: int, passes: int) -> float:
    """Under-sampled first, then informative; see the module docstring.
    priority(0, 0) = 1.25; priority(16, 8) = 0.49; priority(100, 0) = 0.11."""
    p = (passes + 1) / (attempts + 2)
    return p * (1 - p) + 1 / math.sqrt(1 + attempts)


class PassRates:
    """Attempts and passes per task over every committed batch, read from
    the batches' attributes only, each batch once."""

    def __init__(self, store: Store):
        self.store = store
        self.read = Cursor()
        self.attempts: Counter[str] = Counter()
        self.passes: Counter[str] = Counter()

    def refresh(self) -> None:
        reader = self.store.reader()
        for key in reader.unconsumed(self.read):
            try:
                info = reader.info(key)
            except StoreError:
                continue  # a damaged batch: the store's inspect reports it
            for tid, why in zip(info.task_ids, info.failures, strict=False):
                self.attempts[tid] += 1
                self.passes[tid] += why == ""
            self.read.add(key)


class TaskQueue:
    """Draws the task of each group (see the module docstring)."""

    def __init__(
        self,
        files: list[Path],
        weights: list[float],
        seed: int,
        run_dir: str | os.PathLike[str],
        group_size: int,
        refresh_s: float = 5.0,
    ):
        self.files = [list(read_tasks(f)) for f in files]
        self.weights = weights
        self.seed = seed
        self.run_dir = run_dir
        self.group_size = group_size
        self.by_id: dict[str, Task] = {t.task_id: t for tasks in self.files for t in tasks}
        self.file_of: dict[str, int] = {t.task_id: i for i, tasks in enumerate(self.files) for t in tasks}
        self.rates = PassRates(Store.of_run(run_dir))
        self.refresh_s = refresh_s
        self._fresh_at = -math.inf
        self.quarantine: dict[str, str] = {}

    def refresh(self, force: bool = False) -> None:
        """Read new batches and the quarantine, at most every `refresh_s`."""
        if not force and time.monotonic() - self._fresh_at < self.refresh_s:
            return
        self.rates.refresh()
        self.quarantine = quarantined(self.run_dir, list(self.by_id))
        self._fresh_at = time.monotonic()

    def choose(self, group: int, planned: dict[int, str], uncommitted: set[int]) -> Task | None:
        """The task of `group`, given this worker's `planned` groups (group ->
        task id) and which of them are not committed yet. None: every task is
        quarantined."""
        self.refresh()
        live = [[t for t in tasks if t.task_id not in self.quarantine] for tasks in self.files]
        per_file = Counter(self.file_of.get(tid, -1) for tid in planned.values())
        open_files = [i for i, tasks in enumerate(live) if tasks]
        if not open_files:
            return None
        f = min(open_files, key=lambda i: ((per_file[i] + 1) / self.weights[i], i))
        pending = Counter(planned[g] for g in uncommitted if g in planned)
        seen, passes = self.rates.attempts, self.rates.passes
        scores = [priority(seen[t.task_id] + self.group_size * pending[t.task_id], passes[t.task_id]) for t in live[f]]
        rng = random.Random(f"{self.seed}/{group}")
        return rng.choices(live[f], weights=scores, k=1)[0]

    def why_quarantined(self, task_id: str) -> str | None:
        self.refresh()
        return self.quarantine.get(task_id)
