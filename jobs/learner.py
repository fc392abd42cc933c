"""The `learner` role: trains the policy on committed rollouts and publishes
weight versions (rl.learner.loop).

Its role state records the quarantined batches (with reasons) and the last
step's figures; the truth of how far it got is its newest complete
checkpoint, which holds the cursor. Several ranks (`job.nodes` x
`job.tasks_per_node`) each run this role; rank 0 alone commits the state
and beats (rl.run.role). TensorBoard: RUN/tb/learner/ (step: learner step).
"""

from __future__ import annotations

from typing import Any

from rl.context import RunContext
from rl.learner.config import LearnerRole
from rl.run.role import Role


class LearnerJob(Role):
    name = "learner"

    def initial_state(self, role_cfg: LearnerRole) -> dict[str, Any]:
        return {**super().initial_state(role_cfg), "quarantined": {}}

    def progress(self) -> str:
        s = self.state
        if "step" not in s:
            return ""
        return (
            f"step {s['step']}, {s.get('batches', 0)} batches consumed, loss {s.get('loss', 0.0):.4f}, "
            f"reward {s.get('reward_mean', 0.0):.3f}, mismatch KL {s.get('mismatch_kl', 0.0):.4f}, "
            f"{len(s.get('quarantined', {}))} batches quarantined"
            + (f"; ended early: {s['ended']}" if s.get("ended") else "")
        )

    def run(self, ctx: RunContext, cfg: LearnerRole) -> dict[str, Any]:
        from rl.learner.loop import run

        return run(ctx, cfg)
