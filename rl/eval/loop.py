"""The `eval` role: an outline.

    start an engine of its own (`eval.engine`: the generators' unless set)
    loop:
        due = version 0, every `every`-th published version, and once the
              learner is done its last one; in order, not yet evaluated,
              still in the store
        for the oldest due version: load it, play the held-out tasks
              (rl.eval.run.play), commit its figures, draw its curves
        nothing due and the learner done (or no learner): end

Each version is evaluated once: the evaluated versions are in the role
state, committed after each, so a requeued evaluator goes on with the next.
A version that retention deleted before its turn is skipped and named.
TensorBoard (`RUN/tb/eval/`, step: weight version): eval/pass@K, eval/se@K,
eval/failures/REASON (share of samples), eval/minutes. Per-version
results: RUN/eval/v<version>/<tasks>.<mode>/ (rl.eval.run.results_folder).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rl.context import RunContext
from rl.curves import Writer
from rl.eval.config import EvalRole

log = logging.getLogger("sarl.eval")


def run(ctx: RunContext, cfg: EvalRole) -> dict[str, Any]:
    from rl.eval.run import OwnEngine, Plan, play
    from rl.store import Store
    from rl.tasks.format import read_tasks

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    assert cfg.agent is not None and cfg.engine is not None  # resolved by rl.config
    plan = Plan(list(read_tasks(cfg.tasks_file)), str(cfg.tasks_file), cfg.agent, cfg.n, cfg.k, cfg.concurrency)
    evaluated: dict[int, dict[str, Any]] = {int(v): s for v, s in ctx.state.get("evaluated", {}).items()}
    weights = Store.of_run(ctx.run_dir).weights
    curves = EvalCurves(ctx)
    with OwnEngine(ctx, cfg.engine) as own:
        while not ctx.stopping.is_set():
            learner_done = "learner" not in ctx.roles or ctx.done("learner")
            due = due_versions(weights.versions(), set(evaluated), cfg.every, learner_done)
            if not due:
                if learner_done:
                    break
                time.sleep(cfg.poll_s)
                continue
            v = due[0]
            try:
                policy = own.serve(v)
            except Exception as e:  # deleted by retention, or refused: recorded, not retried
                log.warning("version %d not evaluated: %s", v, e)
                evaluated[v] = {"skipped": f"{type(e).__name__}: {e}"}
            else:
                s = play(ctx, plan, policy)
                evaluated[v] = {k: s[k] for k in s if k.startswith(("pass@", "se@")) or k == "failures"}
                curves.draw(v, s, cfg.k)
            ctx.save(evaluated={str(k): x for k, x in sorted(evaluated.items())}, last_version=v, last=evaluated[v])
    curves.close()
    return {"evaluated": sorted(evaluated)}


def due_versions(present: list[int], evaluated: set[int], every: int, learner_done: bool) -> list[int]:
    """Version 0, every `every`-th published one and, once the learner is
    done, its last: those not evaluated yet, oldest first."""
    wanted = {0} | {v for v in present if v % every == 0}
    if learner_done and present:
        wanted.add(max(present))
    return sorted(v for v in wanted if v not in evaluated and (v == 0 or v in present))


class EvalCurves:
    def __init__(self, ctx: RunContext):
        self.tb = Writer(ctx.layout.tb("eval"), "the evaluator")

    def draw(self, v: int, s: dict[str, Any], ks: list[int]) -> None:
        for k in ks:
            self.tb.add_scalar(f"eval/pass@{k}", s[f"pass@{k}"], v)
            self.tb.add_scalar(f"eval/se@{k}", s[f"se@{k}"], v)
        for why, count in s["failures"].items():
            self.tb.add_scalar(f"eval/failures/{why}", count / max(1, s["samples"]), v)
        self.tb.add_scalar("eval/minutes", s["minutes"], v)
        self.tb.flush()

    def close(self) -> None:
        self.tb.close()
