"""The validation role's loop: array task i validates tasks i, i + N,
i + 2N, ... of `validation.tasks_file` in sandboxes (rl.validation.report),
and commits each task's report to its state as it goes, so that a preempted
or killed shard continues with the next unvalidated task.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rl.context import RunContext
from rl.validation.config import ValidationRole


def run(ctx: RunContext, cfg: ValidationRole) -> dict[str, Any]:
    from rl.tasks.format import read_tasks
    from rl.validation.report import validate
    from rl.verify.verifier import Verifier

    shard = list(read_tasks(cfg.tasks_file))[ctx.task :: cfg.workers]
    ctx.save(shard=len(shard))
    reports: list[dict[str, Any]] = list(ctx.state.get("reports", []))
    done = {r["task_id"] for r in reports}
    verify = ctx.verify.model_copy(update={"parallel": cfg.job.cpus_per_task})
    with Verifier(verify, sandbox=ctx.sandbox) as verifier:
        for task in shard:
            if task.task_id in done:
                continue
            report = validate([task], verifier, repeats=cfg.repeats)[0]
            reports.append(asdict(report))
            ctx.save(reports=list(reports))
    return {"task": ctx.task, "validated": len(reports), "ok": sum(r["ok"] for r in reports)}
