"""The `rollout` role: one worker of the rollout array (rl.rollout.worker).

Its state records the groups it abandoned (with their reasons) and its
progress; which groups are committed is read from the store when it starts,
so a worker killed at any instant starts over with exactly the groups that
no batch of its holds.

TensorBoard (`RUN/tb/rollout-NNNNNN/`, step: episodes committed): episodes/s,
reward (histogram and mean), each check, failures by reason, turns, tokens,
time in generate / execute / verify, retries, staleness. `sarl status`
shows groups committed, batches, episodes, retries and failures by reason.
"""

from __future__ import annotations

import logging
from typing import Any

from rl.config import Config, RoleConfig, RolloutRole
from rl.run.role import Role


class Rollout(Role):
    name = "rollout"

    def initial_state(self, role_cfg: RoleConfig) -> dict[str, Any]:
        return {**super().initial_state(role_cfg), "abandoned": {}}

    def progress(self) -> str:
        s = self.state
        if "groups_committed" not in s:
            return ""
        fails = ", ".join(f"{k} {v}" for k, v in sorted(s.get("failures", {}).items()))
        return (
            f"{s['groups_committed']} groups in {s.get('batches', 0)} batches, {s.get('episodes', 0)} episodes "
            f"({fails}), {len(s.get('abandoned', {}))} abandoned, {s.get('retries', 0)} retries"
        )

    def run(self, cfg: Config, role_cfg: RoleConfig) -> dict[str, Any]:
        assert isinstance(role_cfg, RolloutRole)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from rl.rollout.worker import Worker

        worker = Worker(self.run_dir, cfg, role_cfg, self.task, progress=lambda **kw: self.commit(**kw))
        return worker.run(dict(self.state.get("abandoned", {})))
