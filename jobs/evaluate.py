"""The `eval` role: evaluates version 0, every `every`-th published version
and the last on the held-out tasks (rl.eval.loop), with an engine of its
own.

Role state: `evaluated` (version -> pass@k, standard errors, failures),
`last_version`, `last`. TensorBoard (`RUN/tb/eval/`, step: weight version):
eval/pass@K, eval/se@K, eval/failures/REASON (share of samples),
eval/minutes. Per-version results: RUN/eval/v<version>/<tasks>/.
"""

from __future__ import annotations

import logging
from typing import Any

from rl.config import Config, EvalRole, RoleConfig
from rl.run.role import Role


class Evaluate(Role):
    name = "eval"

    def __init__(self, run_dir: str):
        super().__init__(run_dir)
        self.evaluator: Any = None

    def progress(self) -> str:
        s = self.state
        if "last_version" not in s:
            return ""
        last = s.get("last", {})
        figures = ", ".join(f"{k} {v:.3f}" for k, v in last.items() if k.startswith("pass@"))
        return f"{len(s.get('evaluated', {}))} versions evaluated; version {s['last_version']}: {figures or 'skipped'}"

    def run(self, cfg: Config, role_cfg: RoleConfig) -> dict[str, Any]:
        assert isinstance(role_cfg, EvalRole)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from rl.eval.loop import Evaluator

        self.evaluator = Evaluator(self.run_dir, cfg, role_cfg, self.state, save=self.commit)
        return self.evaluator.run()

    def on_usr2(self) -> None:
        """USR2: the evaluated versions are committed after each; the one in
        progress is evaluated again by the requeued job."""
        if self.evaluator is not None:
            self.evaluator.stopping = True
