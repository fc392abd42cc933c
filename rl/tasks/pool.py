"""The pool of tasks a run draws from.

* `TaskPool` keeps per-task attempts and passes in the store (`state/task_pool`)
  and grades difficulty from the observed pass rate.
* `keep_group()` is dynamic sampling: a group whose samples all passed or all
  failed carries no learning signal (zero advantage) and is dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class TaskPool:
    """Per-task statistics kept in the store; difficulty from the pass rate."""

    def __init__(self, store: Any, task_ids: list[str]):
        self.store = store
        self.ids = list(task_ids)
        self.index = {t: i for i, t in enumerate(self.ids)}
        self.attempts = np.zeros(len(self.ids), dtype=np.int64)
        self.passes = np.zeros(len(self.ids), dtype=np.int64)
        saved = store.get_state("task_pool")
        if saved is not None:
            arrays, attrs = saved
            for tid, a, p in zip(attrs["task_ids"], arrays["attempts"], arrays["passes"], strict=True):
                if tid in self.index:
                    self.attempts[self.index[tid]] = a
                    self.passes[self.index[tid]] = p

    def record(self, task_id: str, passed: list[bool]) -> None:
        i = self.index[task_id]
        self.attempts[i] += len(passed)
        self.passes[i] += sum(passed)

    def pass_rate(self, task_id: str) -> float:
        """Smoothed (Laplace) pass rate: 0.5 before any attempt."""
        i = self.index[task_id]
        return float((self.passes[i] + 1) / (self.attempts[i] + 2))

    def difficulty(self, task_id: str) -> str:
        rate = self.pass_rate(task_id)
        return "easy" if rate >= 0.8 else "medium" if rate >= 0.4 else "hard" if rate >= 0.05 else "very hard"

    def save(self) -> int:
        return int(
            self.store.put_state(
                "task_pool", {"attempts": self.attempts, "passes": self.passes}, {"task_ids": self.ids}
            )
        )


def keep_group(rewards: list[float]) -> bool:
    """Dynamic sampling: keep a group only if its rewards are not all equal."""
    return len(rewards) > 1 and max(rewards) != min(rewards)
