"""A generator's TensorBoard curves (`RUN/tb/generator-NNNNNN/`).

Step: seconds since the run started, so that a restarted task's curves go
on forward. Per poll: the loaded version, queued requests, prompts served,
tokens per second of wall time and of engine time, the engine's busy
seconds, its seconds spent loading weight versions, its idle ratio (the
share of the poll's time it neither generated nor loaded weights: it
waited on the rollouts or the learner); per swap: how long it held
requests.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl.curves import Writer


class GeneratorCurves:
    def __init__(self, folder: Path, run_started: float):
        self.run_started = run_started
        self.last = (time.monotonic(), 0, 0.0, 0.0)  # what the next poll measures from
        self.tb = Writer(folder, "this generator")

    def _step(self) -> int:
        return int(time.time() - self.run_started)

    def poll(self, health: dict[str, Any], version: int) -> None:
        if not self.tb.enabled:
            return
        tb, step, now = self.tb, self._step(), time.monotonic()
        since, tokens0, busy0, swap0 = self.last
        tb.add_scalar("generator/version", version, step)
        tb.add_scalar("generator/queued", health["queued"], step)
        tb.add_scalar("generator/prompts_served", health["served"], step)
        tokens, busy, swap = health["tokens"] - tokens0, health["generate_s"] - busy0, health["swap_s"] - swap0
        if now > since:
            tb.add_scalar("generator/tokens_per_s", tokens / (now - since), step)
            tb.add_scalar("generator/idle_ratio", max(0.0, 1.0 - (busy + swap) / (now - since)), step)
        if busy > 0:
            tb.add_scalar("generator/engine_tokens_per_s", tokens / busy, step)
        tb.add_scalar("generator/busy_s", health["generate_s"], step)
        tb.add_scalar("generator/swap_s", health["swap_s"], step)
        tb.flush()
        self.last = (now, health["tokens"], health["generate_s"], health["swap_s"])

    def swapped(self, held_s: float) -> None:
        self.tb.add_scalar("generator/swap_held_s", held_s, self._step())

    def close(self) -> None:
        self.tb.close()
