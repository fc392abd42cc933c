"""The policy as one episode of a rollout worker calls it: through the
generator client, retried across generators by the client; in sync mode
answered only by the round's weight version; the group's first reply taken
from the group's one request (rl.rollout.group_request) when there is one."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

from rl.rollout.endings import Abandon, Stopping
from rl.rollout.group_request import GroupReplies

Generate = Callable[[list[int], Any], tuple[Any, int]]
"""(prompt, sampling) -> (the completion, the weight version that answered)."""


def episode_seed(seed: int, group: int, i: int) -> int:
    """A sampling seed stable across processes (`hash()` of a tuple is not)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{group}/{i}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def episode_policy(
    client: Any,
    i: int,
    round_version: int | None,
    first: GroupReplies | None,
    stopping: threading.Event,
    count: Callable[..., None],
) -> tuple[Generate, Callable[[], float]]:
    """The policy of episode `i` of a group, and the seconds the episode has
    waited for a generator so far (run_episode's `waited`: its deadline
    moves by them). `round_version`: sync mode's round, the one version
    that may answer (None: any). `count` adds to the worker's figures
    (`generator_wait_s`, `generator_retries`)."""
    waited = [0.0]
    asked = [0]

    def ask(prompt: list[int], params: Any) -> tuple[list[Any], int, float]:
        w = 0.0  # seconds waited for a generator, not generating
        while True:
            if stopping.is_set():
                raise Stopping()
            # NoGenerator ends this attempt; the next one starts with its own deadline
            r = client.generate([prompt], params)
            w += r.waited_s
            count(generator_wait_s=r.waited_s, generator_retries=r.attempts - 1)
            if round_version is None or r.version == round_version:
                return r.outputs[0], r.version, w
            if r.version > round_version:
                raise Abandon(f"sync: round {round_version} closed, a generator serves version {r.version}")
            stopping.wait(0.5)  # the generator has not loaded the round's version yet
            w += 0.5

    def generate(prompt: list[int], params: Any) -> tuple[Any, int]:
        asked[0] += 1
        if first is not None and asked[0] == 1:
            completion, version, w = first.reply(i, prompt, params, ask)
        else:
            completions, version, w = ask(prompt, params)
            completion = completions[0]
        waited[0] += w
        return completion, version

    return generate, lambda: waited[0]
