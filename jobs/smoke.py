"""The `smoke` role: a plumbing check of a cluster, with no model (rl.smoke.loop)."""

from __future__ import annotations

from typing import Any

from rl.context import RunContext
from rl.run.role import Role
from rl.smoke.config import SmokeRole


class SmokeJob(Role):
    name = "smoke"

    def initial_state(self, role_cfg: SmokeRole) -> dict[str, Any]:
        return {**super().initial_state(role_cfg), "step": 0, "steps": role_cfg.steps}

    def progress(self) -> str:
        return f"{self.state.get('step', 0)}/{self.state.get('steps', '?')} steps"

    def run(self, ctx: RunContext, cfg: SmokeRole) -> dict[str, Any]:
        from rl.smoke.loop import run

        return run(ctx, cfg)
