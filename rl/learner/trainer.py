"""The policy under DeepSpeed: forward to per-token log-probs, one
optimizer step over a step's micro-batches, checkpoints, the state dict.

DeepSpeed runs on torch.distributed: gloo here (one rank on CPU), NCCL on
a GPU cluster. The optimizer is a torch AdamW object, so that DeepSpeed
builds no fused CUDA op on CPU. DeepSpeed does not restore RNG state: the
learner saves it beside DeepSpeed's files (rl.learner.loop).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl.learner.config import LearnerRole
from rl.learner.correction import correct
from rl.learner.data import micro_batches
from rl.learner.losses import LossInputs
from rl.store import Sample

log = logging.getLogger("sarl.learner")

TAG = "ds"
"""DeepSpeed's checkpoint tag inside each learner checkpoint folder."""


def build_ops() -> None:
    """Build (or find built) the C++ op DeepSpeed's CPU communication loads
    at init. torch waits forever on the lock of a build that was killed
    (a SIGKILLed learner mid-build): a lock older than 10 minutes, when no
    build takes that long, is removed first."""
    from deepspeed.comm.torch import build_shm_op
    from torch.utils.cpp_extension import _get_build_directory

    root = Path(_get_build_directory("x", verbose=False)).parent
    for lock in root.glob("*/lock"):
        if time.time() - lock.stat().st_mtime > 600:
            log.warning("removing a stale build lock %s", lock)
            lock.unlink(missing_ok=True)
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints its build on stdout
        build_shm_op()


def init_distributed() -> None:
    """One process group per learner process. Under Slurm with several
    ranks the launcher's environment (MASTER_ADDR, RANK, WORLD_SIZE) is
    used; alone, a free local port."""
    import deepspeed

    if torch.distributed.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    build_ops()
    deepspeed.init_distributed(dist_backend=backend, verbose=False)


def _schedule(lc: LearnerRole) -> Any:
    o = lc.optimizer

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / (o.warmup_steps + 1)
        if o.schedule == "constant":
            return 1.0
        done = (step - o.warmup_steps) / max(1, lc.steps - o.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))

    return factor


class Trainer:
    def __init__(self, model_path: str, lc: LearnerRole):
        import deepspeed
        from transformers import AutoModelForCausalLM

        if lc.threads:
            torch.set_num_threads(lc.threads)
        init_distributed()
        self.lc = lc
        self.updating = False
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.config.use_cache = False
        o = lc.optimizer
        opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(lc))
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": lc.micro_batches,
            "gradient_clipping": o.grad_clip,
            "zero_optimization": {"stage": lc.zero_stage},
            "bf16": {"enabled": lc.bf16},
            "steps_per_print": 10**9,
        }
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=ds_config
        )

    # --------------------------------------------------------------- forward
    def _forward(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        """Per-token log-probs of each sample's tokens 1..T-1 given those before."""
        n = max(len(s.tokens) for s in samples)
        ids = torch.zeros(len(samples), n, dtype=torch.long)
        attn = torch.zeros(len(samples), n, dtype=torch.long)
        mask = torch.zeros(len(samples), n)
        behaviour = torch.zeros(len(samples), n)
        for i, s in enumerate(samples):
            k = len(s.tokens)
            ids[i, :k] = torch.from_numpy(np.array(s.tokens, dtype=np.int64))
            attn[i, :k] = 1
            mask[i, :k] = torch.from_numpy(np.array(s.loss_mask, dtype=np.float32))
            behaviour[i, :k] = torch.from_numpy(np.array(s.logprobs, dtype=np.float32))
        logits = self.engine(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return {"logp": logp, "mask": mask[:, 1:], "behaviour": behaviour[:, 1:]}

    # ------------------------------------------------------------------ step
    def step(self, samples: list[Sample]) -> dict[str, float] | None:
        """One optimizer step over `samples`; None (nothing applied) when the
        loss or the gradient is not finite."""
        loss_cfg = self.lc.loss
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        groups = torch.tensor([s.group_id for s in samples])
        lengths = torch.tensor([int(np.asarray(s.loss_mask).sum()) for s in samples])
        adv = loss_cfg.advantages(rewards, groups, lengths).float()
        index = {id(s): i for i, s in enumerate(samples)}
        parts = micro_batches(samples, self.lc.micro_batches)
        unit = loss_cfg.unit
        total = float(lengths.sum()) if unit == "tokens" else float(len(samples))
        k = len(parts)
        metrics: dict[str, float] = {"loss": 0.0, "mismatch_kl": 0.0, "masked_frac": 0.0, "clip_frac": 0.0}
        finite = True
        for j, part in enumerate(parts):
            f = self._forward(part)
            corr = correct(f["logp"].detach(), f["behaviour"], f["mask"], self.lc.correction)
            x = LossInputs(
                logp=f["logp"],
                old_logp=f["logp"].detach(),
                behaviour_logp=f["behaviour"],
                mask=corr.mask,
                advantages=adv[[index[id(s)] for s in part]],
                weights=corr.weights,
            )
            out = loss_cfg.compute(x)
            size = float(f["mask"].sum()) if unit == "tokens" else float(len(part))
            share = size / max(total, 1e-9)
            finite = finite and bool(torch.isfinite(out.loss))
            metrics["loss"] += float(out.loss.detach()) * share
            metrics["mismatch_kl"] += corr.mismatch_kl * share
            metrics["masked_frac"] += corr.masked_frac * share
            metrics["clip_frac"] += out.metrics.get("clip_frac", 0.0) * share
            # DeepSpeed divides by the accumulation steps; the share makes the
            # step's loss the loss of all its samples at once
            self.engine.backward(out.loss * share * k)
            if j < k - 1:
                self.engine.step()  # not a boundary: only counts the micro-step
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        # ZeRO 0 keeps whole gradients on the parameters; under 1-2 they are
        # partitioned away and only the loss is checked here
        norms = [torch.linalg.vector_norm(g) for g in grads]
        norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
        if not (finite and math.isfinite(norm)):
            self.engine.zero_grad()
            self.engine.micro_steps -= k - 1  # the boundary step is not taken
            return None
        self.updating = True  # the weights and the optimizer change now
        self.engine.step()
        self.updating = False
        metrics["grad_norm"] = norm
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["samples"] = float(len(samples))
        metrics["tokens"] = float(lengths.sum())
        metrics["reward_mean"] = float(rewards.mean())
        return metrics

    # ----------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under Hugging Face names (what generators load)."""
        return {k: v.detach() for k, v in self.engine.module.state_dict().items()}

    def save(self, folder: Any) -> None:
        self.engine.save_checkpoint(str(folder), tag=TAG)

    def load(self, folder: Any) -> None:
        self.engine.load_checkpoint(str(folder), tag=TAG)
