"""A rollout worker's counts since its start, which its curves and
heartbeat report."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Stats:
    """Counts since this start; updated from episode threads."""

    episodes: int = 0
    retries: int = 0
    """Episodes played again after an infrastructure failure."""
    generator_retries: int = 0
    """Requests that a second generator served after one failed."""
    dropped_groups: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    generator_wait_s: float = 0.0
    gate_wait_s: float = 0.0
    """Seconds with nothing to start: the staleness bound or the round's version."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, **delta: float) -> None:
        with self.lock:
            for k, v in delta.items():
                setattr(self, k, getattr(self, k) + v)

    def failed(self, why: str) -> None:
        with self.lock:
            self.failures[why or "passed"] = self.failures.get(why or "passed", 0) + 1
