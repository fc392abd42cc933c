"""The smoke role's loop: count `steps` steps of `step_s` seconds, committing
the step counter after every step.

Killed, preempted or timed out, a task continues from its last committed
step: its state records every start and the step it started from, which is
what the preemption and resume tests assert on. `fail_tasks` and
`stall_tasks` make a task fail or deadlock half-way, to check how failures
and stalls are reported and recovered.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rl.context import RunContext
from rl.smoke.config import SmokeRole


def run(ctx: RunContext, cfg: SmokeRole) -> dict[str, Any]:
    step = ctx.state.get("step", 0)
    starts = len(ctx.state.get("starts", []))
    while step < cfg.steps:
        half_way = step >= cfg.steps // 2
        if ctx.task in cfg.fail_tasks and half_way:
            raise RuntimeError(f"smoke task {ctx.task} fails at step {step} (smoke.fail_tasks)")
        if ctx.task in cfg.stall_tasks and starts == 1 and half_way:
            threading.Event().wait()  # a deadlock: the beat thread goes on, the loop never again
        time.sleep(cfg.step_s)
        step += 1
        ctx.save(step=step)
    return {"task": ctx.task, "steps": step, "starts": starts}
