"""The `generator` role: one task of the generator array (rl.generator.loop).

`sarl status` shows the version served, where, and the prompts served.
TensorBoard: RUN/tb/generator-NNNNNN/ (rl.generator.curves).
"""

from __future__ import annotations

from typing import Any

from rl.context import RunContext
from rl.generator.config import GeneratorRole
from rl.run.role import Role


class GeneratorJob(Role):
    name = "generator"

    def progress(self) -> str:
        v = self.state.get("version")
        if v is None:
            return ""
        where = f" on {self.state['addr']}:{self.state['port']}" if "port" in self.state else ""
        served = self._beat_info.get("served", self.state.get("served", 0))
        return f"serving version {v}{where}, {served} prompts served"

    def run(self, ctx: RunContext, cfg: GeneratorRole) -> dict[str, Any]:
        from rl.generator.loop import run

        return run(ctx, cfg)
