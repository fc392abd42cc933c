"""The first replies of a group's episodes, sampled as one request.

The `group_size` episodes of a group start from the same prompt. Their
first replies are one request with `n = group_size` (`rollout.group_request`):
one HTTP call and one queue entry instead of `group_size`, whose sequences
enter the engine together, seeded by the group (the service seeds sample j
from the request's seed and j, so the replies do not depend on timing).
Episode i takes reply i. An episode played again after an infrastructure
failure takes its reply i again: the group's replies are sampled once.

Not covered: later turns. Each episode's observation differs, so each
asks alone; the engine's prefix cache keeps the shared history.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Ask = Callable[[list[int], Any], tuple[list[Any], int, float]]
"""(prompt, sampling) -> (its `sampling.n` completions, the weight version
that answered, the seconds it waited for a generator)."""


class GroupReplies:
    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self._lock = threading.Lock()
        self._prompt: list[int] | None = None
        self._got: tuple[list[Any], int, float] | None = None

    def reply(self, i: int, prompt: list[int], params: Any, ask: Ask) -> tuple[Any, int, float]:
        """Episode i's first reply, its weight version, and the seconds this
        episode waited for a generator (not the policy's time: its deadline
        moves by them). The first episode to ask makes the group's request
        while the others wait for it: they waited for a generator as long as
        the request did, or as long as they were held if that was shorter.
        A request that failed (no generator, the worker stopping) is made
        again by the next to ask."""
        t0 = time.monotonic()
        with self._lock:
            held = time.monotonic() - t0
            if self._got is None:
                self._got = ask(prompt, params.model_copy(update={"n": self.size, "seed": self.seed}))
                self._prompt = list(prompt)
                waited = self._got[2]
            elif prompt != self._prompt:  # an episode's first prompt is the task's: the same for the group
                raise ValueError(f"episode {i} of a group asked its first reply for another prompt")
            else:
                waited = min(held, self._got[2])
            completions, version, _ = self._got
        return completions[i], version, waited
