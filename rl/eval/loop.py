"""The `eval` role: an outline.

    start an engine of its own (the generators' settings unless [eval.engine])
    loop:
        due = version 0, every `every`-th published version and the last
              (learner.steps), in order, not yet evaluated, still in the store
        for the oldest due version: load it, play the held-out tasks
              (rl.eval.run.play), commit its figures, write its curves
        nothing due and the learner done (or no learner): end

Each version is evaluated once: the evaluated versions are in the role
state, committed after each, so a requeued evaluator goes on with the next.
A version that retention deleted before its turn is skipped and named.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl.config import Config
from rl.eval.config import EvalRole
from rl.fsio import read_json
from rl.run.rundir import RunDir
from rl.store import Store
from rl.tasks.format import read_tasks

log = logging.getLogger("sarl.eval")


class Evaluator:
    def __init__(self, run_dir: Any, cfg: Config, ec: EvalRole, state: dict[str, Any], save: Callable[..., None]):
        self.run_dir, self.cfg, self.ec, self.save = Path(run_dir), cfg, ec, save
        self.evaluated: dict[int, dict[str, Any]] = {int(v): s for v, s in state.get("evaluated", {}).items()}
        self.store = Store.of_run(run_dir)
        self.stopping = False

    def run(self) -> dict[str, Any]:
        from rl.eval.run import OwnEngine, play

        tasks = list(read_tasks(self.ec.tasks_file))
        tb = self._tb()
        with OwnEngine(self.run_dir, self.cfg, self.ec.engine) as own:
            while not self.stopping:
                due = self.due()
                if due:
                    v = due[0]
                    try:
                        own.serve(v)
                    except Exception as e:  # deleted by retention, or refused: recorded, not retried
                        log.warning("version %d not evaluated: %s", v, e)
                        self._record(v, {"skipped": f"{type(e).__name__}: {e}"})
                        continue
                    s = play(self.run_dir, self.cfg, own.client, "own", own.engine_cfg.max_model_len, tasks,
                             str(self.ec.tasks_file), v, self.ec.n, self.ec.k, self.ec.concurrency)  # fmt: skip
                    self._record(v, {k: s[k] for k in s if k.startswith(("pass@", "se@")) or k == "failures"})
                    if tb is not None:
                        self._curves(tb, v, s)
                    continue
                if self.learner_done():
                    break
                time.sleep(self.ec.poll_s)
        if tb is not None:
            tb.close()
        return {"evaluated": sorted(self.evaluated)}

    def due(self) -> list[int]:
        present = set(self.store.weights.versions())
        last = self.cfg.learner.steps if self.cfg.learner is not None else None
        wanted = {0} | {v for v in present if v % self.ec.every == 0 or v == last}
        return sorted(v for v in wanted if v not in self.evaluated and (v == 0 or v in present))

    def learner_done(self) -> bool:
        if self.cfg.learner is None:
            return True
        state = read_json(RunDir(self.run_dir).state_path("learner", 0)) or {}
        return bool(state.get("done")) and not self.due()

    def _record(self, v: int, figures: dict[str, Any]) -> None:
        self.evaluated[v] = figures
        self.save(evaluated={str(k): x for k, x in sorted(self.evaluated.items())}, last_version=v, last=figures)

    def _curves(self, tb: Any, v: int, s: dict[str, Any]) -> None:
        for k in self.ec.k:
            tb.add_scalar(f"eval/pass@{k}", s[f"pass@{k}"], v)
            tb.add_scalar(f"eval/se@{k}", s[f"se@{k}"], v)
        for why, count in s["failures"].items():
            tb.add_scalar(f"eval/failures/{why}", count / max(1, s["samples"]), v)
        tb.add_scalar("eval/minutes", s["minutes"], v)
        tb.flush()

    def _tb(self) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("tensorboard is not installed: no evaluation curves")
            return None
        return SummaryWriter(str(self.run_dir / "tb" / "eval"))
