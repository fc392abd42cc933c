"""The `validation` role: task validation as a job array.

Array task i validates tasks i, i+N, i+2N, ... of `validation.tasks_file` in
sandboxes and commits each task's report to its state as it goes, so that a
preempted or killed shard continues with the next unvalidated task.
`sarl tasks report RUN_DIR` merges the shards (adding the cross-shard
duplicate check) into RUN_DIR/tasks.report.json and RUN_DIR/tasks.clean.jsonl.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rl.config import Config, RoleConfig, ValidateRole
from rl.run.role import Role


class Validate(Role):
    name = "validation"

    def initial_state(self, role_cfg: RoleConfig) -> dict[str, Any]:
        return {**super().initial_state(role_cfg), "reports": []}

    def progress(self) -> str:
        return f"{len(self.state.get('reports', []))}/{self.state.get('shard', '?')} tasks"

    def run(self, cfg: Config, role_cfg: RoleConfig) -> dict[str, Any]:
        from rl.tasks.format import read_tasks
        from rl.tasks.validation import validate
        from rl.verify.verifier import Verifier

        assert isinstance(role_cfg, ValidateRole)
        shard = list(read_tasks(role_cfg.tasks_file))[self.task :: role_cfg.tasks]
        self.commit(shard=len(shard))
        done = {r["task_id"] for r in self.state["reports"]}
        vcfg = cfg.verify.model_copy(update={"parallel": role_cfg.job.cpus_per_task})
        with Verifier(vcfg, sandbox=cfg.sandbox) as verifier:
            for task in shard:
                if task.task_id in done:
                    continue
                report = validate([task], verifier, repeats=role_cfg.repeats)[0]
                self.commit(reports=[*self.state["reports"], asdict(report)])
        ok = sum(r["ok"] for r in self.state["reports"])
        return {"task": self.task, "validated": len(self.state["reports"]), "ok": ok}
