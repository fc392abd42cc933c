"""Signs of life: every task's heartbeat, written from a thread of its own.

A task's process writes RUN/heartbeats/ROLE/task-NNNNNN.json every
`run.recovery.beat_s` (`Beat`), however long its steps and waits are: a
heartbeat older than `hung_s` means that the process itself no longer runs
(stopped, on a frozen node, stuck in the kernel). The beat also carries
`progress_at`, the last time the task's main loop advanced or waited on
another role (`RunContext.progressed`, called from the loop, never from the
beat thread): a fresh beat with an old `progress_at` means that the process
runs but its work stands still. What recovery does about either is
rl.run.recovery.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("sarl.recovery")


class Beat(threading.Thread):
    """Calls `beat()` every `every` seconds until stopped."""

    def __init__(self, beat: Callable[[], None], every: float):
        super().__init__(name="sarl-beat", daemon=True)
        self.beat_fn, self.every, self.stop = beat, every, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.beat_fn()
            except Exception:  # a full disk now: the next beat tries again
                log.exception("heartbeat failed")
