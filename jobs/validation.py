"""The `validation` role: task validation as a job array (rl.validation.loop).

`sarl tasks report RUN_DIR` merges the shards (adding the cross-shard
duplicate check) into RUN_DIR/tasks.report.json and RUN_DIR/tasks.clean.jsonl.
"""

from __future__ import annotations

from typing import Any

from rl.context import RunContext
from rl.run.role import Role
from rl.validation.config import ValidationRole


class ValidationJob(Role):
    name = "validation"

    def initial_state(self, role_cfg: ValidationRole) -> dict[str, Any]:
        return {**super().initial_state(role_cfg), "reports": []}

    def progress(self) -> str:
        return f"{len(self.state.get('reports', []))}/{self.state.get('shard', '?')} tasks"

    def run(self, ctx: RunContext, cfg: ValidationRole) -> dict[str, Any]:
        from rl.validation.loop import run

        return run(ctx, cfg)
