"""A rollout worker's TensorBoard curves (`RUN/tb/rollout-NNNNNN/`).

The step is the number of episodes of this worker's groups committed,
counted from the store at start, so that it never goes back after a
restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rl.agent.tools import INVALID_CALLS, TOOL_FAILURES, tool_validity
from rl.curves import Writer
from rl.episodes.samples import agent_shares, failure_of
from rl.store import Sample


class RolloutCurves:
    def __init__(self, folder: Path, group_size: int, harness: bool = False):
        self.group_size = group_size
        self.harness = harness
        """Episodes are agent programs' sessions with the endpoint (rl.rollout.harness)."""
        self.tb = Writer(folder, "this rollout worker")

    def batch(
        self,
        groups_committed: int,
        seq: int,
        results: list[Any],
        samples: list[Sample],
        stats: Any,
        wall_s: float,
        latest_version: int,
    ) -> None:
        if not self.tb.enabled:
            return
        tb, step = self.tb, groups_committed * self.group_size
        episodes = [e for r in results for e in r.episodes]
        rewards = np.array([s.reward for s in samples])
        tb.add_scalar("rollout/episodes_per_s", stats.episodes / max(1e-9, wall_s), step)
        tb.add_histogram("rollout/reward", rewards, step)
        tb.add_scalar("rollout/reward_mean", float(rewards.mean()), step)
        for name in samples[0].checks:
            vals = [s.checks[name] for s in samples if not np.isnan(s.checks[name])]
            if vals:
                tb.add_scalar(f"rollout/check/{name}", float(np.mean(vals)), step)
        for why, n in stats.failures.items():
            tb.add_scalar(f"rollout/failures/{why}", n, step)
        tb.add_scalar("rollout/turns", float(np.mean([e.turns for e in episodes])), step)
        # the same figures as `sarl eval`'s: does the agent use its turns, and do they fix anything?
        whys = [failure_of(e) for e in episodes]
        reached = [e.turns >= 2 for e in episodes]
        fixed = sum(r and w == "" for r, w in zip(reached, whys, strict=True))
        shares = agent_shares(len(episodes), whys.count("crash"), sum(reached), fixed)
        for k, v in shares.items():
            if v is not None:
                tb.add_scalar(f"rollout/{k}", v, step)
        calls = sum(e.tool_calls for e in episodes)
        if calls:  # environments with tools: how many calls, and what went wrong with them
            invalid = sum(e.tool_failures[w] for e in episodes for w in INVALID_CALLS)
            tb.add_scalar("rollout/tools/calls_per_episode", calls / len(episodes), step)
            tb.add_scalar("rollout/tools/valid_share", tool_validity(calls, invalid), step)
            for why in TOOL_FAILURES:
                tb.add_scalar(f"rollout/tools/{why}", sum(e.tool_failures[why] for e in episodes) / calls, step)
        if self.harness:  # a program re-sends its history as text: how often did its rendering drift?
            tb.add_scalar("rollout/harness/calls_per_episode", float(np.mean([e.turns for e in episodes])), step)
            tb.add_scalar(
                "rollout/harness/retokenized_per_episode", float(np.mean([e.retokenized for e in episodes])), step
            )
            tb.add_scalar("rollout/harness/samples_per_episode", len(samples) / len(episodes), step)
        tb.add_scalar("rollout/tokens", float(np.mean([len(e.trajectory) for e in episodes])), step)
        for t in ("generate_s", "execute_s", "verify_s"):
            tb.add_scalar(f"rollout/time/{t}", float(np.mean([e.timings.get(t, 0.0) for e in episodes])), step)
        tb.add_scalar("rollout/retries", stats.retries, step)
        tb.add_scalar("rollout/generator_retries", stats.generator_retries, step)
        tb.add_scalar("rollout/generator_wait_s", stats.generator_wait_s, step)
        tb.add_scalar("rollout/gate_wait_s", stats.gate_wait_s, step)
        # the share of this worker's time with nothing to play: the staleness
        # (or sync round) gate held every group back, waiting for the learner
        tb.add_scalar("rollout/idle_ratio", min(1.0, stats.gate_wait_s / max(1e-9, wall_s)), step)
        tb.add_scalar("rollout/staleness", float(latest_version - min(s.policy_version for s in samples)), step)
        tb.add_scalar("rollout/batches", seq + 1, step)
        tb.flush()

    def sandboxes(self, groups_committed: int, replaced: int, verifier_replaced: int, verifier_lost: int) -> None:
        """Sandbox faults outside the policy's code, counted since the worker
        started: sandboxes found dead or hung in a warm pool and replaced
        (the episodes' pool, the verifier's), and verifications run again
        because their sandbox died before they began."""
        if not self.tb.enabled:
            return
        step = groups_committed * self.group_size
        self.tb.add_scalar("rollout/sandboxes/replaced", replaced, step)
        self.tb.add_scalar("rollout/verifier/sandboxes_replaced", verifier_replaced, step)
        self.tb.add_scalar("rollout/verifier/runs_again", verifier_lost, step)
        self.tb.flush()

    def close(self) -> None:
        self.tb.close()
