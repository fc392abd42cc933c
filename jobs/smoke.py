"""The `smoke` role: a plumbing check of a cluster, with no model.

Each task counts `steps` steps of `step_s` seconds and commits its step
counter after every step. Killed, preempted or timed out, it continues from
the last committed step: its state records every start and the step it
started from, which is what the preemption and resume tests assert on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rl.config import Config, RoleConfig, SmokeRole
from rl.run.role import Role


class Smoke(Role):
    name = "smoke"

    def initial_state(self, role_cfg: RoleConfig) -> dict[str, Any]:
        assert isinstance(role_cfg, SmokeRole)
        return {**super().initial_state(role_cfg), "step": 0, "steps": role_cfg.steps}

    def progress(self) -> str:
        return f"{self.state.get('step', 0)}/{self.state.get('steps', '?')} steps"

    def run(self, cfg: Config, role_cfg: RoleConfig) -> dict[str, Any]:
        assert isinstance(role_cfg, SmokeRole)
        while self.state["step"] < role_cfg.steps:
            if self.task in role_cfg.fail_tasks and self.state["step"] >= role_cfg.steps // 2:
                raise RuntimeError(f"smoke task {self.task} fails at step {self.state['step']} (smoke.fail_tasks)")
            stall = self.task in role_cfg.stall_tasks and len(self.state["starts"]) == 1
            if stall and self.state["step"] >= role_cfg.steps // 2:
                threading.Event().wait()  # a deadlock: the beat thread goes on, the loop never again
            time.sleep(role_cfg.step_s)
            self.commit(step=self.state["step"] + 1)
        return {"task": self.task, "steps": self.state["step"], "starts": len(self.state["starts"])}
