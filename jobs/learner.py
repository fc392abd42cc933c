"""The `learner` role: trains the policy on committed rollouts
(rl.learner.loop) and publishes weight versions.

Its role state records the quarantined batches (with reasons) and the last
step's figures; the truth of how far it got is its newest complete
checkpoint, which holds the cursor. On USR2 it saves the last completed
step at once, then requeues.

TensorBoard (`RUN/tb/learner/`, step: learner step): loss and its terms
(policy_loss, kl_ref), entropy, mismatch_kl (behaviour vs trainer
log-probs), ratio_mean, ratio_max, masked_frac, clip_frac, grad_norm, lr,
tokens_per_s, step_s, wait_s, idle_ratio, staleness, staleness_hist,
dropped_stale, reward_mean, reward_std, advantage_mean, advantage_abs,
response_len, response_len_max, samples, tokens, version.

Several ranks (`job.nodes` x `job.tasks_per_node`) each run this role;
rank 0 alone commits the state and beats (rl.run.role).
"""

from __future__ import annotations

import logging
from typing import Any

from rl.config import Config, LearnerRole, RoleConfig
from rl.run.role import Role


class Learner(Role):
    name = "learner"

    def __init__(self, run_dir: str):
        super().__init__(run_dir)
        self.learner: Any = None

    def initial_state(self, role_cfg: RoleConfig) -> dict[str, Any]:
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

    def run(self, cfg: Config, role_cfg: RoleConfig) -> dict[str, Any]:
        assert isinstance(role_cfg, LearnerRole)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from rl.learner.loop import Learner as Loop

        quarantined = self.state.get("quarantined", {})
        self.learner = Loop(self.run_dir, cfg, role_cfg, quarantined, save=self.commit, progressed=self.progressed)
        return self.learner.run()

    def on_usr2(self) -> None:
        """USR2: save the last completed step first, then requeue."""
        if self.learner is not None:
            self.learner.on_signal()
