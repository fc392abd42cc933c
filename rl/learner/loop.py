"""The learner: an outline.

    resume from the newest complete checkpoint (model, optimizer, scheduler,
        RNG of python, numpy and torch, step, cursor) that loads (one that
        does not is set aside as bad-step-N, with why), else the base model
        at step 0 (version 0)
    while step < steps:
        data = committed batches the cursor has not consumed, each once
               (rl.learner.data: whole groups, stale ones dropped and counted)
        one optimizer step on them (rl.learner.trainer); a loss or gradient
               that is not finite is not applied: the learner rolls back to
               its last checkpoint, quarantines the batches with the reason,
               and goes on
        step += 1, and the cursor takes the batches, together
        publish weight version `step` every `publish_every` steps
        checkpoint every `checkpoint_every` steps, at the end, and on USR2
    once every rollout worker is done, what is left makes a last, smaller
        step, and the learner ends (before `steps`, saying so): a run with
        fewer rollouts than its steps need ends instead of waiting forever

Exactly once: the cursor travels inside the checkpoint with the weights it
produced, so a learner killed at any instant resumes with exactly the
batches its restored weights have not seen. Each checkpoint's meta keeps
the history of which batches each step applied.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl.config import Config
from rl.learner import dist
from rl.learner.checkpoints import LearnerCheckpoints
from rl.learner.config import LearnerRole
from rl.learner.data import StepData, take_step
from rl.learner.references import References
from rl.run.rundir import RunDir
from rl.store import Cursor, Store

log = logging.getLogger("sarl.learner")


def rng_state() -> dict[str, Any]:
    """Every library's RNG, as JSON."""
    py = random.getstate()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [x.tolist() if isinstance(x, np.ndarray) else x for x in np.random.get_state()],
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate((s["python"][0], tuple(s["python"][1]), s["python"][2]))
    n = s["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.tensor(s["torch"], dtype=torch.uint8))


class Learner:
    def __init__(
        self,
        run_dir: Any,
        cfg: Config,
        lc: LearnerRole,
        quarantined: dict[str, str],
        save: Callable[..., None],
        progressed: Callable[[], None] = lambda: None,
    ):
        self.run_dir, self.cfg, self.lc, self.save_state = Path(run_dir), cfg, lc, save
        self.progressed = progressed
        """Says that the loop advanced or waits for batches (rl.run.recovery's stall check)."""
        self.store = Store.of_run(run_dir)
        self.checkpoints = LearnerCheckpoints(run_dir)
        self.quarantined = dict(quarantined)
        """Batches not trained on ('writer/seq' -> reason)."""
        self.step = 0
        self.cursor = Cursor()
        self.history: list[list[Any]] = []
        self.saved_step = -1
        self.applying = False
        self.stopping = False
        self.trainer: Any = None
        self.references: References | None = None
        self.lead = True
        """Rank 0: the one that reads and writes the store and the run directory."""
        self.ended = ""
        """Why the loop ended before `steps` (empty: it did not)."""
        self._rollouts_read = float("-inf")
        self.model_path: Any = None
        self.set_aside: dict[str, str] = {}
        """Checkpoints that could not be loaded: folder name -> why."""

    def run(self) -> dict[str, Any]:
        from rl.learner.trainer import Trainer
        from rl.model import checkpoint

        model_path = checkpoint(self.cfg.model)
        self.model_path = model_path
        self.trainer = Trainer(str(model_path), self.lc)
        self.lead = dist.rank() == 0
        self.references = self._references(model_path)
        self._resume()
        tb = self._tb() if self.lead else None
        while self.step < self.lc.steps and not self.stopping:
            t0 = time.monotonic()
            data = self._next_data()
            if data is None:
                if not self.stopping:  # the rollouts ended with every batch consumed
                    self.ended = f"the rollout workers are done and every batch is consumed, at step {self.step}"
                    log.warning("learner ends before step %d: %s", self.lc.steps, self.ended)
                    self.save_state(ended=self.ended)
                break
            t1 = time.monotonic()
            samples = data.samples
            if self.lc.loss.type == "sft":  # rejection sampling: only what passed is imitated
                samples = [s for s in samples if s.failure == "" and s.reward > 0]
            if not samples:
                self._consume(data.keys, "no sample to train on")
                continue
            metrics = self.trainer.step(samples)
            if metrics is None:
                self._roll_back([f"{w}/{s}" for w, s in data.keys], "loss or gradient not finite")
                continue
            self.applying = True  # a USR2 now must not save half of this
            self.step += 1
            for key in data.keys:
                self.cursor.add(key)
            self.history.append([self.step, [f"{w}/{s}" for w, s in data.keys]])
            self.applying = False
            step_s = time.monotonic() - t1
            metrics.update(wait_s=t1 - t0, step_s=step_s, dropped_stale=data.dropped_stale)
            metrics["tokens_per_s"] = metrics["tokens"] / max(step_s, 1e-9)
            metrics["idle_ratio"] = (t1 - t0) / max(time.monotonic() - t0, 1e-9)
            staleness = [self.step - 1 - v for v in data.versions]
            metrics["staleness"] = float(np.mean(staleness)) if staleness else 0.0
            self._after_step(metrics, tb, [self.step - 1 - s.policy_version for s in samples])
        if self.saved_step != self.step:
            self.save_checkpoint()
        if tb is not None:
            tb.close()
        out: dict[str, Any] = {"step": self.step, "batches": len(self.cursor), "quarantined": len(self.quarantined)}
        return {**out, "ended": self.ended} if self.ended else out

    # ------------------------------------------------------------ the parts
    def _references(self, model_path: Path) -> References | None:
        loss = self.lc.loss
        if loss.type != "sft" or loss.source != "references":
            return None
        from rl.agent.config import AgentConfig
        from rl.model import load_tokenizer

        agent = self.cfg.rollout.agent if self.cfg.rollout is not None else AgentConfig()
        return References(loss.tasks_file, load_tokenizer(model_path), agent, self.cfg.run.seed)

    def _next_data(self) -> StepData | None:
        """Rank 0 reads the store; every rank trains on what it read. SFT on
        references reads no store: a step's samples follow from the step."""
        if self.references is not None:
            return StepData(self.references.step(self.step, self.lc.samples_per_step), [])
        data = None
        if self.lead:
            data = take_step(
                self.store, self.cursor, self.lc.samples_per_step, self.lc.tokens_per_step, self.step,
                self.lc.max_staleness,
                self.cfg.run.mode == "sync", self.lc.poll_s, self._waiting,
                lambda key, why: self._consume([key], why), self._rollouts_over,
            )  # fmt: skip
        return dist.broadcast(data)

    def _waiting(self) -> bool:
        """Asked at every poll for batches: waiting on the rollouts is not a
        stall. True when the learner is stopping."""
        self.progressed()
        return self.stopping

    def _rollouts_over(self) -> bool:
        """Every rollout worker of the run is done: no batch will come after
        those committed. Read at most every 10 s (a file per worker); a run
        without rollout workers (batches written by other means) never is."""
        if self.cfg.rollout is None or time.monotonic() - self._rollouts_read < 10.0:
            return False
        self._rollouts_read = time.monotonic()
        return RunDir(self.run_dir).all_done("rollout")

    def _resume(self) -> None:
        """Load the newest checkpoint that loads. One whose payload is not
        what was written (a torn, lost or changed file: checked by rank 0
        against the checkpoint's manifest before any rank loads, so every
        rank falls back together), or that DeepSpeed cannot load, is set
        aside, and the one before it is loaded: the steps after that one are
        redone, each on the batches it took (the cursor goes back with the
        checkpoint). With several ranks a checkpoint that passes the check
        and still fails to load stops the learner: the ranks would have to
        agree after a failed collective load, which is not built."""
        load_failed = False  # only ever with one rank: several stop at a failed load
        while True:
            latest = dist.broadcast(self._intact() if self.lead else None)
            if latest is None:
                if load_failed:  # the failed load may have changed some weights: start clean
                    from rl.learner.trainer import Trainer

                    self.trainer = Trainer(str(self.model_path), self.lc)
                random.seed(self.cfg.run.seed)
                np.random.seed(self.cfg.run.seed % 2**32)
                torch.manual_seed(self.cfg.run.seed)
                return
            try:
                self.trainer.load(latest.path)
                break
            except Exception as e:
                if dist.world() > 1:
                    raise
                load_failed = True
                self._set_aside(latest, f"{type(e).__name__}: {str(e)[:300]}")
        self.step, self.cursor, self.saved_step = latest.step, latest.cursor, latest.step
        self.history = list(latest.meta.get("history", []))
        set_rng_state(latest.meta["rng"])
        for key in self.quarantined:
            w, _, s = key.rpartition("/")
            self.cursor.add((w, int(s)))
        log.info("resumed at step %d with %d batches consumed", self.step, len(self.cursor))

    def _intact(self) -> Any:
        """Rank 0: the newest checkpoint whose payload is as written; the
        damaged ones after it are set aside."""
        while (ck := self.checkpoints.latest()) is not None and (why := self.checkpoints.damage(ck)):
            self._set_aside(ck, why)
        return ck

    def _set_aside(self, ck: Any, why: str) -> None:
        why = f"step {ck.step}: cannot be loaded: {why}"
        where = self.checkpoints.set_aside(ck.path, why)
        self.set_aside[where.name] = why
        self.save_state(checkpoints_set_aside=dict(self.set_aside))
        log.error("learner checkpoint %s set aside (%s); the one before it is loaded", where, why)

    def _consume(self, keys: list[tuple[str, int]], why: str) -> None:
        """Batches read and not trained on (no step taken): recorded, never read again."""
        for w, s in keys:
            self.cursor.add((w, s))
            self.quarantined[f"{w}/{s}"] = why
        self.save_state(quarantined=dict(self.quarantined))

    def _roll_back(self, keys: list[str], why: str) -> None:
        for k in keys:
            self.quarantined[k] = f"step {self.step + 1}: {why}"
        self.save_state(quarantined=dict(self.quarantined))
        log.warning("step %d not applied (%s): batches %s quarantined; rolling back", self.step + 1, why, keys)
        self._resume()

    def _after_step(self, metrics: dict[str, float], tb: Any, staleness: list[int]) -> None:
        lc = self.lc
        # A step redone after a restart (the predecessor died after publishing it, before
        # its next checkpoint) publishes nothing: versions only go forward, and that
        # version may be pruned already. The generators keep the predecessor's weights
        # until this learner publishes a newer version.
        published = self.store.weights.latest() if self.lead else None
        redone = dist.broadcast(published is not None and self.step <= published)
        if (self.step % lc.publish_every == 0 or self.step == lc.steps) and not redone:
            weights = self.trainer.state_dict()  # every rank: under ZeRO-3 a gather
            if self.lead:
                self.store.weights.publish(weights, version=self.step, dtype=self.cfg.model.dtype)
                if lc.keep_versions is not None:
                    self.store.weights.retain(lc.keep_versions)
        elif redone:
            log.warning("step %d redone after a restart: version %s is published already", self.step, published)
        if self.step % lc.checkpoint_every == 0 or self.step == lc.steps:
            self.save_checkpoint()
        self.save_state(step=self.step, batches=len(self.cursor), **{k: round(v, 6) for k, v in metrics.items()})
        log.info("step %d: loss %.4f reward %.3f", self.step, metrics["loss"], metrics["reward_mean"])
        if tb is not None:
            for k, v in metrics.items():
                tb.add_scalar(f"learner/{k}", v, self.step)
            tb.add_histogram("learner/staleness_hist", np.asarray(staleness, dtype=np.float64), self.step)
            tb.add_scalar("learner/version", self.store.weights.latest() or 0, self.step)
            tb.flush()

    def save_checkpoint(self) -> None:
        """Commit model, optimizer, scheduler, RNG, step and cursor together.
        With several ranks every rank writes DeepSpeed's files into the
        folder rank 0 builds, and rank 0 commits it."""
        if self.trainer is None or self.applying or self.trainer.updating or self.saved_step == self.step:
            return
        if self.lead:
            meta = {"rng": rng_state(), "history": self.history, "version": self.store.weights.latest() or 0}
            meta["ranks"] = dist.world()
            save = lambda folder: self.trainer.save(dist.broadcast(folder))  # noqa: E731
            self.checkpoints.save(self.step, self.cursor, meta, save, keep=self.lc.keep_checkpoints)
        else:
            self.trainer.save(dist.broadcast(None))
        self.saved_step = self.step

    def on_signal(self) -> None:
        """USR2 (preemption, time limit): save the last completed step now.
        Weights only change inside the step's last optimizer call, which is
        marked, so a save here is never of a half-applied step. With several
        ranks a save is a collective, which a signal handler on rank 0 alone
        cannot start: the requeued learner resumes from the last periodic
        checkpoint, and redoes the steps after it (their batches once)."""
        self.stopping = True
        if dist.world() == 1:
            self.save_checkpoint()

    def _tb(self) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("tensorboard is not installed: no learner curves")
            return None
        # resumed at step N, the steps after N that a killed predecessor drew are
        # redone: purge_step makes TensorBoard drop its points from N + 1 on
        return SummaryWriter(str(self.run_dir / "tb" / "learner"), purge_step=self.step + 1 if self.step else None)
