"""The `rollout` role: one worker of the rollout array (rl.rollout.loop).

Its state records the task planned for each group and the groups it
abandoned (with their reasons); which groups are committed is read from the
store when it starts. Recovery hands a given-up worker's share of the
groups to another worker (rl.rollout.shares, through the hooks below).
TensorBoard: RUN/tb/rollout-NNNNNN/ (rl.rollout.curves).
"""

from __future__ import annotations

from typing import Any

from rl.context import RunContext
from rl.rollout import shares
from rl.rollout.config import RolloutRole
from rl.run.role import Role


class RolloutJob(Role):
    name = "rollout"

    def initial_state(self, role_cfg: RolloutRole) -> dict[str, Any]:
        return {**super().initial_state(role_cfg), "planned": {}, "abandoned": {}}

    def progress(self) -> str:
        from rl.rollout.loop import progress

        return progress(self.state, self._beat_info.get("inflight", 0))

    def run(self, ctx: RunContext, cfg: RolloutRole) -> dict[str, Any]:
        from rl.rollout.loop import run

        return run(ctx, cfg)

    restart_also = staticmethod(shares.restart_also)
    before_restart = staticmethod(shares.undone)
    on_given_up = staticmethod(shares.on_given_up)
