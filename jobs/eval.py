"""The `eval` role: evaluates version 0, every `every`-th published version
and the last on the held-out tasks, with an engine of its own
(rl.eval.loop).

Role state: `evaluated` (version -> pass@k, standard errors, failures),
`last_version`, `last`.
"""

from __future__ import annotations

from typing import Any

from rl.context import RunContext
from rl.eval.config import EvalRole
from rl.run.role import Role


class EvalJob(Role):
    name = "eval"

    def progress(self) -> str:
        s = self.state
        if "last_version" not in s:
            return ""
        last = s.get("last", {})
        figures = ", ".join(f"{k} {v:.3f}" for k, v in last.items() if k.startswith("pass@"))
        return f"{len(s.get('evaluated', {}))} versions evaluated; version {s['last_version']}: {figures or 'skipped'}"

    def run(self, ctx: RunContext, cfg: EvalRole) -> dict[str, Any]:
        from rl.eval.loop import run

        return run(ctx, cfg)
