"""The learner: an outline (the parts are rl.learner.training).

    resume from the newest complete checkpoint (model, optimizer, scheduler,
        RNG of python, numpy and torch, step, cursor) that loads (one that
        does not is set aside as bad-step-N, with why), else the base model
        at step 0 (version 0)
    while step < steps:
        data = committed batches the cursor has not consumed, each once
               (rl.learner.data: whole groups, stale ones dropped and counted;
               sync: the round of version `step`, whole once each of its
               groups is committed or given up)
        sync, and nothing to train on: a step without an update, which
               publishes the same weights as the next round's version
        one optimizer step on them (rl.learner.trainer); a loss or gradient
               that is not finite is not applied: the learner rolls back to
               its last checkpoint, quarantines the batches with the reason,
               and goes on
        step += 1, and the cursor takes the batches, together
        publish weight version `step` every `publish_every` steps
        checkpoint every `checkpoint_every` steps, at the end, and on USR2
        (a save between steps, never of a half-applied one)
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
import time
from typing import Any

import numpy as np

from rl.context import RunContext, usr2_held
from rl.learner.config import LearnerRole


def run(ctx: RunContext, cfg: LearnerRole) -> dict[str, Any]:
    from rl.learner.data import signal_share
    from rl.learner.training import Training

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    t = Training(ctx, cfg)
    ctx.on_usr2(t.on_signal)
    t.start()
    while t.step < cfg.steps and not ctx.stopping.is_set():
        t0 = time.monotonic()
        data = t.next_data()
        if data is None:
            if not ctx.stopping.is_set():  # the rollouts ended with every batch consumed
                t.end_early(f"the rollout workers are done and every batch is consumed, at step {t.step}")
            break
        t1 = time.monotonic()
        samples = t.trainable(data)
        if not samples:
            if ctx.sync:  # the next round starts only with the next version
                t.empty_step(data, f"round {t.step} has no sample to train on ({data.given_up} groups given up)")
            else:
                t.consume(data.keys, "no sample to train on")
            continue
        with usr2_held():  # the weights change before the step is counted: a save must wait for both
            metrics = t.trainer.step(samples)
            if metrics is None:
                t.roll_back(data.keys, "loss or gradient not finite")
                continue
            t.apply(data)
        step_s = time.monotonic() - t1
        metrics.update(wait_s=t1 - t0, step_s=step_s, dropped_stale=data.dropped_stale, given_up_groups=data.given_up)
        metrics["groups_with_signal"] = signal_share(data.samples)
        metrics["tokens_per_s"] = metrics["tokens"] / max(step_s, 1e-9)
        metrics["idle_ratio"] = (t1 - t0) / max(time.monotonic() - t0, 1e-9)
        metrics["staleness"] = float(np.mean([t.step - 1 - v for v in data.versions] or [0]))
        t.after_step(metrics, [t.step - 1 - s.policy_version for s in samples])
    return t.finish()
