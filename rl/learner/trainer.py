"""The policy under DeepSpeed: forward to per-token log-probs (rl.learner.logprobs), one
optimizer step over a step's micro-batches, checkpoints, the state dict.

DeepSpeed runs on torch.distributed (rl.learner.dist): gloo on CPU, NCCL
on GPUs. With several ranks (data parallel), each rank takes its share of
a step's micro-batches, and DeepSpeed averages their gradients. ZeRO
stages 0-3 partition optimizer state, gradients and (3) weights over the
ranks. The optimizer is a torch AdamW object, so that DeepSpeed builds no
fused CUDA op on CPU. DeepSpeed does not restore RNG state: the
learner saves it beside DeepSpeed's files (rl.learner.loop).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl.learner import dist
from rl.learner.config import LearnerRole
from rl.learner.correction import correct
from rl.learner.data import MIN_SHARED_PREFIX, micro_batches, shared_prefix
from rl.learner.logprobs import token_logprobs
from rl.learner.losses import LossInputs
from rl.store import Sample

log = logging.getLogger("sarl.learner")

TAG = "ds"
"""DeepSpeed's checkpoint tag inside each learner checkpoint folder."""


def _schedule(lc: LearnerRole) -> Any:
    """The learning rate's factor at each optimizer update: warmup and decay
    count learner steps (a step takes `ppo_epochs x minibatches` updates)."""
    o = lc.optimizer
    per_step = lc.ppo_epochs * lc.minibatches

    def factor(update: int) -> float:
        step = update // per_step
        if step < o.warmup_steps:
            return (step + 1) / (o.warmup_steps + 1)
        if o.schedule == "constant":
            return 1.0
        done = (step - o.warmup_steps) / max(1, lc.steps - o.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))

    return factor


def freeze_below(model: Any, top: int) -> None:
    """Train only the top `top` decoder blocks and the final norm. Autograd
    then stops at the lowest trained block: the frozen blocks cost a forward
    pass and no backward, and their weights no optimizer state. The
    embeddings stay frozen (SmolLM2 ties them to the output layer)."""
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"learner.train_top_layers: {type(model).__name__} has no model.layers to choose from")
    if not 1 <= top <= len(blocks):
        raise ValueError(f"learner.train_top_layers = {top}: the model has {len(blocks)} decoder blocks")
    model.requires_grad_(False)
    for block in blocks[len(blocks) - top :]:
        block.requires_grad_(True)
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


def with_lora(model: Any, lora: Any, seed: int) -> Any:
    """`model` with LoRA adapters (peft) on `lora.target_modules`, every
    other weight frozen. The adapters start as peft starts them (A random,
    B zero: the model is unchanged), from `seed`, whatever the RNG's state."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            return get_peft_model(model, config)
        except ValueError as e:  # a target module the model does not have
            raise ValueError(f"learner.lora.target_modules: {e}") from None


def _minibatches(samples: list[Sample], k: int) -> list[list[Sample]]:
    """`samples` in `k` shares of whole groups (group-relative advantages
    are computed over the step first), in their order; fewer when there are
    fewer groups."""
    groups: dict[int, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    order = list(groups.values())
    k = max(1, min(k, len(order)))
    return [[s for g in order[i::k] for s in g] for i in range(k)]


def episode_advantages(loss_cfg: Any, samples: list[Sample]) -> torch.Tensor:
    """Each sample's advantage, from its group's rewards counted once per
    episode: an episode may come as several samples (an endpoint session
    whose re-rendered prompts drifted from the sampled ids, rl.gateway.capture),
    and must weigh in its group as one. Its samples share its advantage;
    its length is theirs together."""
    key: dict[tuple[int, str], int] = {}
    which = [key.setdefault((s.group_id, s.episode_id or f"#{i}"), len(key)) for i, s in enumerate(samples)]
    rewards = torch.zeros(len(key), dtype=torch.float64)
    groups = torch.zeros(len(key), dtype=torch.long)
    lengths = torch.zeros(len(key), dtype=torch.long)
    for s, k in zip(samples, which, strict=True):
        rewards[k], groups[k] = s.reward, s.group_id
        lengths[k] += int(np.asarray(s.loss_mask).sum())
    adv = loss_cfg.advantages(rewards, groups, lengths).float()
    return adv[torch.tensor(which, dtype=torch.long)]


class Trainer:
    def __init__(self, model_path: str, lc: LearnerRole, rendezvous: Path | None = None, seed: int = 0):
        import deepspeed
        from transformers import AutoModelForCausalLM

        from rl.precision import learner_precision

        if lc.threads:
            torch.set_num_threads(lc.threads)
        dist.init_distributed(rendezvous, lc.collective_timeout_s)
        self.lc = lc
        self.rank, self.world = dist.rank(), dist.world()
        self.updating = False
        self.precision = learner_precision(lc.precision)
        """float32, bf16-autocast or bf16: `lc.precision` decided on this machine (rl.precision)."""
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.config.use_cache = False
        self.reference: Any = None
        if lc.loss.kl_coef > 0 and lc.lora is None:  # the base model, frozen: what the KL term pulls towards
            self.reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
            self.reference.requires_grad_(False)
        if lc.train_top_layers is not None:
            freeze_below(model, lc.train_top_layers)
        if lc.lora is not None:
            if self.precision != "float32":
                # the frozen base in bf16: its products are bf16 under autocast anyway, and a
                # float32 base is cast again at every forward (30% of a LoRA step on 2 cores)
                model.to(torch.bfloat16)
            model = with_lora(model, lc.lora, seed)  # adapters in float32 (peft's autocast_adapter_dtype)
        self.partial = any(not p.requires_grad for p in model.parameters())
        """Some weights are frozen (LoRA, train_top_layers): they are neither
        optimised nor checkpointed (the base model holds them)."""
        o = lc.optimizer
        params = [p for p in model.parameters() if p.requires_grad]  # no moments for frozen weights
        opt = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(lc))
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,
            # the learner owns accumulation: a step has as many micro-batches
            # as its samples need, and step() is the boundary (the all-reduce)
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "gradient_clipping": o.grad_clip,
            "zero_optimization": {"stage": lc.zero_stage},
            "bf16": {"enabled": self.precision == "bf16"},
            "steps_per_print": 10**9,
        }
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=ds_config
        )
        if self.reference is not None:
            self.reference.to(self.engine.device)

    def _autocast(self) -> Any:
        """bf16 matrix products under `bf16-autocast` (the weights, the
        log-softmax and the loss stay float32); nothing otherwise."""
        return torch.autocast(self.engine.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16-autocast")

    # --------------------------------------------------------------- forward
    def _forward(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        """Per-token log-probs (and entropies) of each sample's tokens 1..T-1
        given those before."""
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
        # each sample's log-probs at the temperature it was sampled at (greedy's are the plain softmax's)
        temps = torch.tensor([s.temperature if s.temperature > 0 else 1.0 for s in samples])
        dev = self.engine.device
        ids, attn, mask, behaviour, temps = (t.to(dev) for t in (ids, attn, mask, behaviour, temps))
        p = shared_prefix(samples) if self.lc.share_prefixes else 0
        p = p if p >= MIN_SHARED_PREFIX else 0
        with self._autocast():
            logp, entropy, _ = token_logprobs(self.engine, ids, attn, mask, temps, p)
        out = {"logp": logp, "mask": mask[:, 1:], "behaviour": behaviour[:, 1:], "entropy_sum": entropy}
        if self.lc.loss.kl_coef > 0:  # the base model's log-probs: a frozen copy, or the adapters switched off
            with torch.no_grad(), self._autocast():
                if self.reference is not None:
                    out["ref_logp"] = token_logprobs(self.reference, ids, attn, mask, temps, p)[0]
                else:
                    with self.engine.module.disable_adapter():
                        out["ref_logp"] = token_logprobs(self.engine, ids, attn, mask, temps, p)[0]
        return out

    def _micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        lc = self.lc
        return micro_batches(samples, lc.micro_batches, lc.micro_batch_tokens, lc.share_prefixes)

    # ------------------------------------------------------------------ step
    def step(self, samples: list[Sample]) -> dict[str, float] | None:
        """One learner step over `samples` (every rank is given the same):
        `ppo_epochs` passes, each of `minibatches` optimizer updates on a
        share of the samples. The PPO ratio of every update is against the
        proximal policy, the weights before the step's first update (AReaL's
        decoupled objective; the importance weight against the behaviour
        policy is the correction's): with one update it is 1 and the clip
        cannot bind; with several it does. None (the step is not applied:
        the caller rolls back) when a loss or a gradient is not finite.
        Figures are the mean over the updates."""
        adv = episode_advantages(self.lc.loss, samples)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        lengths = torch.tensor([int(np.asarray(s.loss_mask).sum()) for s in samples])
        index = {id(s): i for i, s in enumerate(samples)}
        updates = self.lc.ppo_epochs * self.lc.minibatches
        proximal = self._proximal(samples) if updates > 1 else None
        per_update: list[dict[str, float]] = []
        try:
            for _ in range(self.lc.ppo_epochs):
                for share in _minibatches(samples, self.lc.minibatches):
                    m = self._update(share, adv[[index[id(s)] for s in share]], proximal)
                    if m is None:
                        self.updating = False  # nothing to count: the caller rolls back
                        return None
                    per_update.append(m)
        except BaseException:
            self.updating = False
            raise
        # `updating` stays set until the learner has counted the step (Training.apply): a save
        # between the first update and the count would be of weights ahead of their step
        metrics = {k: float(np.mean([m[k] for m in per_update])) for k in per_update[0]}
        metrics["ratio_max"] = max(m["ratio_max"] for m in per_update)
        metrics.update(
            updates=float(updates),
            lr=float(self.scheduler.get_last_lr()[0]),
            samples=float(len(samples)),
            tokens=float(lengths.sum()),
            reward_mean=float(rewards.mean()),
            reward_std=float(rewards.std(unbiased=False)),
            advantage_mean=float(adv.mean()),
            advantage_abs=float(adv.abs().mean()),
            response_len=float(lengths.float().mean()),
            response_len_max=float(lengths.max()),
        )
        return metrics

    def _proximal(self, samples: list[Sample]) -> dict[int, torch.Tensor]:
        """Every sample's log-probs under the weights before the step's
        first update (no gradient): what the PPO ratio of each update is
        against."""
        out: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for part in self._micro_batches(samples):
                if not part:
                    continue
                logp = self._forward(part)["logp"].cpu()
                for i, s in enumerate(part):
                    out[id(s)] = logp[i, : len(s.tokens) - 1]
        return out

    def _update(
        self, samples: list[Sample], adv: torch.Tensor, proximal: dict[int, torch.Tensor] | None
    ) -> dict[str, float] | None:
        """One optimizer update over `samples` (their advantages `adv`).
        Each micro-batch's loss is weighted by its share of the update's
        samples (or tokens, as the loss averages), so the gradient is that
        of all its samples at once, however they are split over micro-batches
        and ranks."""
        loss_cfg = self.lc.loss
        lengths = torch.tensor([int(np.asarray(s.loss_mask).sum()) for s in samples])
        index = {id(s): i for i, s in enumerate(samples)}
        parts = self._micro_batches(samples)
        parts += [[] for _ in range(-len(parts) % self.world)]  # each rank the same number of passes
        mine = parts[self.rank :: self.world]
        unit = loss_cfg.unit
        total = float(lengths.sum()) if unit == "tokens" else float(len(samples))
        sums: dict[str, float] = {}  # token-weighted sums of this rank's per-token figures

        def add(name: str, value: float) -> None:
            sums[name] = sums.get(name, 0.0) + value

        finite, ratio_max = True, 0.0
        for part in mine:
            # a rank with fewer samples than micro-batches still takes every
            # micro-step (its collectives), with a pass of weight 0
            weight = 1.0 if part else 0.0
            part = part or samples[:1]
            f = self._forward(part)
            old = f["logp"].detach()
            if proximal is not None:
                old = torch.zeros_like(old)
                for i, s in enumerate(part):
                    old[i, : len(s.tokens) - 1] = proximal[id(s)].to(old.device)
            corr = correct(old, f["behaviour"], f["mask"], self.lc.correction)
            x = LossInputs(
                logp=f["logp"],
                old_logp=old,
                behaviour_logp=f["behaviour"],
                mask=corr.mask,
                advantages=adv[[index[id(s)] for s in part]].to(self.engine.device),
                weights=corr.weights,
                ref_logp=f.get("ref_logp"),
            )
            out = loss_cfg.compute(x)
            size = float(f["mask"].sum()) if unit == "tokens" else float(len(part))
            share = weight * size / max(total, 1e-9)
            tokens = weight * float(f["mask"].sum())
            finite = finite and bool(torch.isfinite(out.loss))
            add("loss", float(out.loss.detach()) * share)
            for name, value in out.metrics.items():
                add(name, value * share)
            add("mismatch_kl", corr.mismatch_kl * tokens)
            add("masked_frac", corr.masked_frac * tokens)
            add("ratio_mean", corr.ratio_mean * tokens)
            add("entropy", weight * float(f["entropy_sum"]))
            ratio_max = max(ratio_max, corr.ratio_max * weight)
            # the all-reduce averages over ranks: x world makes it the sum of shares
            self.engine.backward(out.loss * share * self.world, scale_wrt_gas=False)
        names = sorted(sums)
        # Under ZeRO 0 each rank holds its whole gradient in p.grad, before the
        # all-reduce in step(): a NaN on any rank is caught on every rank. Under
        # ZeRO 1-3 p.grad is empty (DeepSpeed keeps partitions); its optimizer
        # takes the partitioned gradient's norm and skips a non-finite update
        # itself, leaving weights, moments and the schedule as they were: its
        # verdict is read after step() (was_step_applied).
        norms = [torch.linalg.vector_norm(p.grad) for p in self.engine.module.parameters() if p.grad is not None]
        local = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
        *totals, bad = dist.all_sum([sums[n] for n in names] + [float(not (finite and math.isfinite(local)))])
        summed = dict(zip(names, totals, strict=True))
        if bad:
            self.engine.zero_grad()
            return None
        self.updating = True  # the weights and the optimizer change now, until the step's last update
        self.engine.step()
        if not self.engine.was_step_applied():  # ZeRO 1-3: the gradient's norm was not finite
            return None
        n_tok = max(float(lengths.sum()), 1.0)
        per_token = ("mismatch_kl", "masked_frac", "ratio_mean", "entropy")
        metrics = {n: summed[n] / n_tok if n in per_token else summed[n] for n in names}
        metrics["ratio_max"] = dist.all_max(ratio_max)
        norm = self.engine.get_global_grad_norm()  # of the all-reduced gradient, before clipping
        metrics["grad_norm"] = float(norm) if norm is not None else local
        return metrics

    # ----------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under Hugging Face names (what generators load), or
        under LoRA the adapters alone (rl.engine.lora). Under ZeRO-3 each
        rank holds a partition of every weight: this gathers them (a
        collective: every rank calls it) and copies them out."""
        module = self.engine.module
        if self.lc.lora is not None:
            from rl.engine.lora import adapter_tensors

            gather = self.lc.zero_stage == 3
            if not gather:
                return adapter_tensors(module)
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                return adapter_tensors(module)
        if self.lc.zero_stage < 3:
            return {k: v.detach() for k, v in module.state_dict().items()}
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def adapter_record(self) -> dict[str, Any] | None:
        """What a publish of `state_dict()` says of it: the adapters' rank,
        alpha and scale under LoRA, None for whole weights."""
        lora = self.lc.lora
        if lora is None:
            return None
        return {"rank": lora.rank, "alpha": lora.alpha, "scale": lora.alpha / lora.rank}

    def save(self, folder: Any) -> None:
        """DeepSpeed's checkpoint: the trained weights (all of them, or
        without the frozen ones: the base model holds those), the
        optimizer's moments of the trained ones, the schedule."""
        self.engine.save_checkpoint(str(folder), tag=TAG, exclude_frozen_parameters=self.partial)

    def load(self, folder: Any) -> None:
        """Raises on a checkpoint DeepSpeed cannot read (a missing file makes
        it return nothing rather than raise)."""
        path, _ = self.engine.load_checkpoint(str(folder), tag=TAG, load_module_strict=not self.partial)
        if path is None:
            raise RuntimeError(f"{folder}: DeepSpeed found no checkpoint to load (tag {TAG})")
