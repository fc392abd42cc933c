"""The learner's parts (the outline is rl.learner.loop): resume from the
newest checkpoint that loads, the data of each step, a step applied or
rolled back, weight versions published, checkpoints saved.

`Training` holds what a learner task knows while it runs: the step, the
cursor of consumed batches, the quarantined batches, the step history that
each checkpoint keeps, and the trainer (rl.learner.trainer).
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl.context import RunContext
from rl.curves import Writer
from rl.fsio import CorruptFile, read_json
from rl.learner import dist
from rl.learner.checkpoints import LearnerCheckpoints
from rl.learner.config import LearnerRole
from rl.learner.data import Need, StepData, shuffled_rewards, take_step
from rl.learner.references import Epochs, References
from rl.store import Cursor, Sample, Store

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


class Training:
    """One learner task's training, in the run context `ctx`: `ctx.save`
    commits the role state (quarantined batches, the last step's figures),
    `ctx.progressed` says that the loop advanced or waits for batches
    (rl.run.recovery's stall check), `ctx.stopping` is set on USR2."""

    def __init__(self, ctx: RunContext, lc: LearnerRole):
        self.ctx, self.lc = ctx, lc
        self.run_dir = Path(ctx.run_dir)
        self.save_state = ctx.save
        self.store = Store.of_run(ctx.run_dir)
        self.checkpoints = LearnerCheckpoints(ctx.run_dir)
        self.quarantined: dict[str, str] = dict(ctx.state.get("quarantined", {}))
        """Batches not trained on ('writer/seq' -> reason)."""
        self.step = 0
        self.cursor = Cursor()
        self.history: list[list[Any]] = []
        self.saved_step = -1
        self.applying = False
        self.trainer: Any = None
        self.references: Epochs | None = None
        self.lead = True
        """Rank 0: the one that reads and writes the store and the run directory."""
        self.ended = ""
        """Why the loop ended before `steps` (empty: it did not)."""
        self._rollouts_read = float("-inf")
        self.model_path: Any = None
        self.set_aside: dict[str, str] = {}
        """Checkpoints that could not be loaded: folder name -> why."""
        self.pace_s: float | None = None
        """Seconds per step (its wall time, smoothed), since this process started."""
        self.tb: Writer | None = None  # rank 0's alone
        self.rendezvous = ctx.layout.checkpoints("learner") / "rendezvous"
        """Where the ranks meet (rl.learner.dist)."""
        self._kept_alive = time.monotonic()
        self._start_weights: dict[str, Any] | None = None
        """The run's starting weights (rank 0, read at the first publish)."""
        self._start_norm2 = 0.0
        """Their squared norm."""

    # ------------------------------------------------------------ start, end
    def start(self) -> None:
        """The trainer on the base model, the newest checkpoint that loads, the curves."""
        from rl.learner.trainer import Trainer
        from rl.model import checkpoint

        self.model_path = checkpoint(self.ctx.model)
        self.trainer = Trainer(str(self.model_path), self.lc, rendezvous=self.rendezvous, seed=self.ctx.seed)
        self.lead = dist.rank() == 0
        if self.lead:
            from rl.precision import describe

            log.info("learner precision %s (%s)", self.trainer.precision, describe())
            self.save_state(precision=self.trainer.precision)
        self.references = self._references(self.model_path)
        self._resume()
        self.tb = self._tb() if self.lead else None

    def end_early(self, why: str) -> None:
        self.ended = why
        log.warning("learner ends before step %d: %s", self.lc.steps, why)
        self.save_state(ended=why)

    def finish(self) -> dict[str, Any]:
        """The last checkpoint, the curves closed; the task's result."""
        if self.saved_step != self.step:
            self.save_checkpoint()
        if self.tb is not None:
            self.tb.close()
        out: dict[str, Any] = {"step": self.step, "batches": len(self.cursor), "quarantined": len(self.quarantined)}
        return {**out, "ended": self.ended} if self.ended else out

    # --------------------------------------------------------------- a step
    def trainable(self, data: StepData) -> list[Sample]:
        """The samples a step trains on: with SFT only what passed is imitated
        (rejection sampling); in a control run (`shuffle_rewards`) with each
        step's rewards permuted among its samples."""
        if self.lc.loss.type == "sft":
            return [s for s in data.samples if s.failure == "" and s.reward > 0]
        if self.lc.shuffle_rewards:
            return shuffled_rewards(data.samples, self.ctx.seed, self.step)
        return data.samples

    def apply(self, data: StepData) -> None:
        """The step is taken: the step count and the cursor move together."""
        self.applying = True  # a USR2 now must not save half of this
        self.step += 1
        for key in data.keys:
            self.cursor.add(key)
        self.history.append([self.step, [f"{w}/{s}" for w, s in data.keys]])
        self.trainer.updating = False  # the weights and their step agree again
        self.applying = False

    def next_data(self) -> StepData | None:
        """Rank 0 reads the store; every rank trains on what it read. SFT on
        references reads no store: a step's samples follow from the step."""
        if self.references is not None:
            return StepData(self.references.step(self.step, self.lc.samples_per_step), [])
        data = None
        if self.lead:
            self._kept_alive = time.monotonic()  # the other ranks start waiting in the broadcast below now
            need = Need(
                samples=self.lc.samples_per_step,
                tokens=self.lc.tokens_per_step,
                max_staleness=self.ctx.max_staleness,
                sync=self.ctx.sync,
                groups_per_step=self.lc.groups_per_step,
                poll_s=self.lc.poll_s,
            )
            data = take_step(self.store, self.cursor, self.step, need, self)
        return dist.broadcast(data)

    # what take_step asks while it waits (rl.learner.data.Feed)
    def should_stop(self) -> bool:
        """Asked at every poll for batches: waiting on the rollouts is not a
        stall; the other ranks, waiting in a broadcast, are kept alive. True
        when the learner is stopping."""
        self.ctx.progressed()
        if time.monotonic() - self._kept_alive > min(dist.KEEPALIVE_S, self.lc.collective_timeout_s / 5):
            dist.broadcast_waiting()
            self._kept_alive = time.monotonic()
        return self.ctx.stopping.is_set()

    def skip(self, key: tuple[str, int], why: str) -> None:
        self.consume([key], why)

    def exhausted(self) -> bool:
        """Every rollout worker of the run is done: no batch will come after
        those committed. Read at most every 10 s (a file per worker); a run
        without rollout workers (batches written by other means) never is."""
        if "rollout" not in self.ctx.roles or time.monotonic() - self._rollouts_read < 10.0:
            return False
        self._rollouts_read = time.monotonic()
        return self.ctx.done("rollout")

    def consume(self, keys: list[tuple[str, int]], why: str) -> None:
        """Batches read and not trained on (no step taken): recorded, never read again."""
        for w, s in keys:
            self.cursor.add((w, s))
            self.quarantined[f"{w}/{s}"] = why
        self.save_state(quarantined=dict(self.quarantined))

    def roll_back(self, keys: list[tuple[str, int]], why: str) -> None:
        """A step that cannot be applied: its batches are quarantined with
        the reason, and the learner goes back to its last checkpoint."""
        names = [f"{w}/{s}" for w, s in keys]
        for k in names:
            self.quarantined[k] = f"step {self.step + 1}: {why}"
        self.save_state(quarantined=dict(self.quarantined))
        log.warning("step %d not applied (%s): batches %s quarantined; rolling back", self.step + 1, why, names)
        self._resume()

    # --------------------------------------------------------------- resume
    def _references(self, model_path: Path) -> Epochs | None:
        loss = self.lc.loss
        if loss.type != "sft" or loss.source == "passing":
            return None
        from rl.model import load_tokenizer

        if loss.source == "traces":
            from rl.learner.trace_data import Traces

            assert loss.traces_file is not None  # the loss's validator: source = "traces" needs it
            return Traces(loss.traces_file, load_tokenizer(model_path), self.ctx.seed)
        assert self.lc.agent is not None  # resolved by rl.config: the rollouts' agent, or the default
        return References(
            loss.tasks_file, load_tokenizer(model_path), self.lc.agent, self.ctx.seed, repairs=loss.repairs
        )

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

                    self.trainer = Trainer(
                        str(self.model_path), self.lc, rendezvous=self.rendezvous, seed=self.ctx.seed
                    )
                random.seed(self.ctx.seed)
                np.random.seed(self.ctx.seed % 2**32)
                torch.manual_seed(self.ctx.seed)
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

    # ------------------------------------------------------- after a step
    def after_step(self, metrics: dict[str, float], staleness: list[int]) -> None:
        """Publish, checkpoint, commit the step's figures, draw its curves."""
        tb = self.tb
        figures = self._publish_and_checkpoint()
        metrics.update(figures)
        # the step's wall time, waiting for rollouts included, smoothed: `sarl status` shows it and the time left
        wall = metrics["wait_s"] + metrics["step_s"] + figures.get("publish_s", 0.0) + figures.get("checkpoint_s", 0.0)
        self.pace_s = wall if self.pace_s is None else 0.8 * self.pace_s + 0.2 * wall
        metrics["pace_s"] = self.pace_s
        self.save_state(step=self.step, batches=len(self.cursor), **{k: round(v, 6) for k, v in metrics.items()})
        log.info("step %d: loss %.4f reward %.3f", self.step, metrics["loss"], metrics["reward_mean"])
        if tb is not None:
            for k, v in metrics.items():
                tb.add_scalar(f"learner/{k}", v, self.step)
            tb.add_histogram("learner/staleness_hist", np.asarray(staleness, dtype=np.float64), self.step)
            tb.add_scalar("learner/version", self.store.weights.latest() or 0, self.step)
            tb.flush()

    def empty_step(self, data: StepData, why: str) -> None:
        """Sync: a round that ended with nothing to train on (every group
        given up, or nothing passed for SFT) is a step without an update:
        the cursor takes its batches and the unchanged weights are published
        as the next version, which the next round waits for."""
        log.warning("step %d: %s; no update, the same weights published as its version", self.step + 1, why)
        self.apply(data)
        figures = self._publish_and_checkpoint()
        self.save_state(step=self.step, batches=len(self.cursor), last_empty_step=self.step, last_empty_why=why)
        if self.tb is not None:
            self.tb.add_scalar("learner/given_up_groups", data.given_up, self.step)
            self.tb.add_scalar("learner/empty_step", 1.0, self.step)
            for k, v in figures.items():
                self.tb.add_scalar(f"learner/{k}", v, self.step)
            self.tb.add_scalar("learner/version", self.store.weights.latest() or 0, self.step)
            self.tb.flush()

    def _publish_and_checkpoint(self) -> dict[str, float]:
        """Publish (every `publish_every` steps) and checkpoint (every
        `checkpoint_every`). Figures: the seconds each took, and the weights'
        relative distance from the run's start when this step published (rank 0)."""
        lc = self.lc
        figures: dict[str, float] = {}
        t0 = time.monotonic()
        # A step redone after a restart (the predecessor died after publishing it, before
        # its next checkpoint) publishes nothing: versions only go forward, and that
        # version may be pruned already. The generators keep the predecessor's weights
        # until this learner publishes a newer version.
        published = self.store.weights.latest() if self.lead else None
        redone = dist.broadcast(published is not None and self.step <= published)
        if (self.step % lc.publish_every == 0 or self.step == lc.steps) and not redone:
            weights = self.trainer.state_dict()  # every rank: under ZeRO-3 a gather
            if self.lead:
                adapter = self.trainer.adapter_record()
                dtype = None if adapter is not None else self._published_dtype()  # adapters: float32, a few MB
                self.store.weights.publish(weights, version=self.step, dtype=dtype, adapter=adapter)
                if lc.keep_versions is not None:
                    self.store.weights.retain(lc.keep_versions, also_keep=self._not_yet_evaluated())
                figures["publish_s"] = time.monotonic() - t0
                figures["weight_change"] = self._weight_change(weights)
        elif redone:
            log.warning("step %d redone after a restart: version %s is published already", self.step, published)
        if self.step % lc.checkpoint_every == 0 or self.step == lc.steps:
            t1 = time.monotonic()
            self.save_checkpoint()
            figures["checkpoint_s"] = time.monotonic() - t1
        return figures

    def _not_yet_evaluated(self) -> set[int]:
        """Versions the run's evaluator will evaluate and has not yet (every
        `eval_every`-th: rl.eval.loop.due_versions), read from its state."""
        every = self.lc.eval_every
        if every is None:
            return set()
        try:
            state = read_json(self.ctx.layout.state_path("eval", 0))
        except CorruptFile:  # unreadable: nothing is known to be evaluated
            state = None
        done = {int(v) for v in state.get("evaluated", {})} if isinstance(state, dict) else set()
        return {v for v in self.store.weights.versions() if v % every == 0 and v not in done}

    def _published_dtype(self) -> str:
        """Full weights are published in `[model] dtype`, or under `auto` in
        the learner's own precision: bf16 under its bf16 modes (the
        generators' cast where they compute in float32), else float32."""
        if self.ctx.model.dtype != "auto":
            return str(self.ctx.model.dtype)
        return "float32" if self.trainer.precision == "float32" else "bfloat16"

    def _weight_change(self, weights: dict[str, Any]) -> float:
        """||w - w0|| / ||w0|| over every weight the run's model file holds:
        how far training has moved the policy (a step of RL that moves it by
        1e-5 has changed nothing a held-out score could show); under LoRA,
        w - w0 is each adapter's scale x B A. The start, and its norm, are
        read once from the model folder (the base, or the export RL began
        from). One tensor's difference at a time: at every publish of
        SmolLM2-135M the whole difference in float64 took seconds."""
        import math

        import torch

        if self._start_weights is None:
            from safetensors.torch import load_file

            self._start_weights = {}
            for f in sorted(Path(self.model_path).glob("*.safetensors")):
                self._start_weights.update(load_file(str(f)))
            self._start_norm2 = sum(
                float(w0.float().pow(2).sum(dtype=torch.float64)) for w0 in self._start_weights.values()
            )
        adapter = self.trainer.adapter_record()
        if adapter is not None:
            from rl.engine.lora import delta_norm2

            self._start_weights.clear()  # a LoRA delta needs the start's norm alone: its tensors are not kept
            num = delta_norm2(weights, float(adapter["scale"]))
        else:  # against the start as the learner holds it (rounded to bf16 in its bf16 mode)
            num = 0.0
            for k, w0 in self._start_weights.items():
                w = weights.get(k)
                if w is not None and tuple(w.shape) == tuple(w0.shape):
                    num += float((w.detach().float() - w0.to(w.dtype).float()).pow_(2).sum(dtype=torch.float64))
        return math.sqrt(num / self._start_norm2) if self._start_norm2 > 0 else float("nan")

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
        The signal is held while a step updates the weights and is counted
        (rl.context.usr2_held), so a save here is never of a half-applied
        step, nor skipped for one. With several
        ranks a save is a collective, which a signal handler on rank 0 alone
        cannot start: the requeued learner resumes from the last periodic
        checkpoint, and redoes the steps after it (their batches once)."""
        if dist.world() == 1:
            self.save_checkpoint()

    def _tb(self) -> Writer:
        # resumed at step N, the steps after N that a killed predecessor drew are
        # redone: purge_step makes TensorBoard drop its points from N + 1 on
        return Writer(self.ctx.layout.tb("learner"), "the learner", purge_step=self.step + 1)
