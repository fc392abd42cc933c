"""The `[learner]` role section (pydantic only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rl.agent.config import AgentConfig
from rl.learner.losses import GRPO, Loss
from rl.schema import SAFE, RoleConfig, Section, resolved


class Correction(Section):
    """Truncated importance sampling and ratio masking."""

    tis_cap: float | None = Field(2.0, gt=0)
    """Cap of the importance weight trainer / generator; none: no weight."""
    mask: Literal["none", "token", "sequence"] = "none"
    """Drop tokens (or whole samples) whose ratio leaves [band_low, band_high]."""
    band_low: float = Field(0.5, gt=0)
    """Lower end of the ratio band."""
    band_high: float = Field(2.0, gt=0)
    """Upper end of the ratio band."""

    @model_validator(mode="after")
    def _band(self) -> Correction:
        if self.band_low >= self.band_high:
            raise ValueError(f"band_low = {self.band_low} must be below band_high = {self.band_high}")
        return self


class OptimizerConfig(Section):
    """AdamW with warmup and a schedule, given to DeepSpeed as a torch object
    (so that no fused CUDA op is built on CPU)."""

    lr: float = Field(1e-6, gt=0)
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay."""
    warmup_steps: int = Field(0, ge=0)
    """Steps of linear warmup from 0 to `lr`."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After warmup: constant, or cosine decay to 10% of `lr` at `learner.steps`."""
    grad_clip: float = Field(1.0, gt=0)
    """Global gradient norm clip."""


class LoraSection(Section):
    """Train low-rank adapters (peft LoRA) instead of every weight: the
    base stays frozen, the optimizer holds the adapters' moments alone, a
    publish writes the adapters alone (a few MB), and generators merge them
    into their resident copy of the base."""

    rank: int = Field(16, ge=1, le=1024)
    """The adapters' rank r."""
    alpha: float = Field(32.0, gt=0)
    """Scale numerator: an adapter adds (alpha / rank) x B A to its weight."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input (0: none, and a step is deterministic)."""
    target_modules: Literal["all-linear"] | list[str] = "all-linear"
    """The linear layers that get an adapter: `all-linear` (every one but
    the output layer), or module name suffixes (`["q_proj", "v_proj"]`)."""


class LearnerRole(RoleConfig):
    """The learner: trains the policy on committed rollout batches, each
    once, and publishes weight versions. One task; its ranks (data
    parallel) are `job.nodes x job.tasks_per_node` processes."""

    workers: int = Field(1, ge=1, le=1)
    """Always 1: one learner per run."""
    steps: int = Field(10, ge=1)
    """Optimizer steps to take; the run's last weight version is `steps`."""
    loss: Loss = GRPO()
    """The objective: grpo, dr_grpo, dapo, gspo, cispo or sft."""
    correction: Correction = Correction()
    """Off-policy correction against the behaviour log-probs."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """AdamW, warmup, schedule, clipping."""
    samples_per_step: int = Field(8, ge=1)
    """Samples a step trains on at least (whole batches, so whole groups)."""
    tokens_per_step: int | None = Field(None, ge=1)
    """When set, a step takes whole batches until it has this many trained
    (sampled) tokens, instead of `samples_per_step` samples."""
    ppo_epochs: int = Field(1, ge=1, le=64)
    """Passes over a step's samples (PPO epochs)."""
    minibatches: int = Field(1, ge=1, le=1024)
    """Optimizer updates per pass, each on a share of the step's groups. The
    PPO ratio of every update is against the weights before the step's first
    one (AReaL's decoupled objective): with `ppo_epochs x minibatches` = 1
    it is 1 and the clip (`loss.clip`, `clip_high`) cannot bind; with more
    it does (`clip_frac`). Warmup and decay count learner steps."""
    micro_batch_tokens: int | None = Field(4096, ge=1)
    """Gradient accumulation by a token budget: each micro-batch is packed
    up to this many padded tokens (longest sample x samples), so memory
    stays bounded whatever the lengths (long multi-turn samples ran a
    learner out of memory at a fixed count); a step takes as many as its
    samples need. The loss is normalised over the whole step, so the split
    does not change it."""
    micro_batches: int | None = Field(None, ge=1, le=1024)
    """Instead of the token budget: split each step into exactly this many
    micro-batches of about equal tokens."""
    share_prefixes: bool = True
    """Compute a group's shared prompt once for all its replies: with the
    token budget, such a group is a micro-batch of its own, and its replies
    attend to one pass over the prompt (a key-value cache). The log-probs
    and gradients are those of one pass a reply, within float rounding.
    Off under ZeRO-3 and for models whose decoder cannot be called apart."""
    publish_every: int = Field(1, ge=1)
    """Publish a weight version every this many steps (and at the last)."""
    checkpoint_every: int = Field(1, ge=1, json_schema_extra=SAFE)
    """Checkpoint every this many steps (and on USR2, and at the last)."""
    keep_checkpoints: int = Field(2, ge=1, json_schema_extra=SAFE)
    """Complete checkpoints kept; older ones are deleted."""
    keep_versions: int | None = Field(3, ge=1, json_schema_extra=SAFE)
    """Published weight versions kept in the store besides those a generator
    or `sarl eval` pins while it loads one, those the run's evaluator has yet
    to evaluate, and the full versions their deltas point into; None: all
    (full weights of a 7B model are 15 GB a version)."""
    zero_stage: int = Field(0, ge=0, le=3)
    """DeepSpeed ZeRO stage: 0 replicates everything on each rank; 1
    partitions the optimizer state over the ranks, 2 also the gradients, 3
    also the weights (gathered to publish them)."""
    precision: Literal["auto", "float32", "bf16-autocast", "bf16"] = "auto"
    """How the learner computes. `float32`; `bf16-autocast`: float32 weights
    and optimizer, matrix products in bf16 (torch.autocast), log-probs and
    the loss in float32 (under LoRA the frozen base is held in bf16); `bf16`:
    DeepSpeed's bf16 mode (bf16 weights, float32 master weights in the
    optimizer). `auto`: `bf16` where the learner's device multiplies in
    bf16 (a CUDA device that supports it, a CPU with avx512_bf16 or
    amx_bf16; the fastest mode there, with or without LoRA: rl.precision),
    float32 elsewhere. Log-probs are float32 in every mode.
    Published full weights are bf16 under the bf16 modes, float32 under
    float32, unless `[model] dtype` names one."""
    lora: LoraSection | None = None
    """Train LoRA adapters (`[learner.lora]`); none: every weight (or the
    top `train_top_layers` blocks)."""
    collective_timeout_s: float = Field(900.0, ge=30, json_schema_extra=SAFE)
    """Seconds any collective of the ranks may wait (a step's all-reduce, a
    broadcast, a checkpoint): a rank that stops answering makes the others
    fail within it, and the learner is started again. Rank 0 keeps the
    others waiting for rollouts alive with a message every 30 s. Meeting
    at start (through the run directory) waits as long."""
    poll_s: float = Field(1.0, gt=0, json_schema_extra=SAFE)
    """Seconds between looks at the store while waiting for rollouts."""
    threads: int = Field(0, ge=0, json_schema_extra=SAFE)
    """torch intra-op threads (0: torch's default)."""
    eval_every: int | None = resolved("eval.every")
    """The run's evaluator evaluates every this many versions: retention
    keeps those until it has (None: the run has no evaluator)."""
    groups_per_step: int | None = resolved("rollout.groups_per_step")
    """The groups of one sync round: a sync step waits until each is
    committed or given up (None without rollout workers)."""
    agent: AgentConfig | None = resolved("rollout.agent")
    """The rollouts' agent (the default agent where the run has no rollout
    workers): the prompts SFT on references imitates. (The temperature the
    learner's log-probs are taken at is each sample's own, recorded with
    it: rl.store.Sample.temperature.)"""
    shuffle_rewards: bool = False
    """A control run: each step's rewards are permuted among its samples
    (seeded by the run's seed and the step) before the advantages. Same
    samples, same compute, same seed: what RL gains beyond such a run is the
    reward's doing, not the updates' (`sarl bench learn`). The curves and
    the role state show the true rewards."""
    train_top_layers: int | None = Field(None, ge=1)
    """Train only the top N decoder blocks and the final norm; None: every
    weight. Frozen blocks cost no backward pass and no optimizer state: on
    CPUs and small budgets, a step takes about half the time."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "bf16" in data:
            raise ValueError(
                'bf16: replaced by `precision` ("auto", "float32", "bf16-autocast" or "bf16"; '
                '`bf16 = true` is `precision = "bf16"`)'
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> LearnerRole:
        if self.lora is not None and self.train_top_layers is not None:
            raise ValueError("lora and train_top_layers: choose one way to train part of the model")
        if self.micro_batches is not None:
            if "micro_batch_tokens" in self.model_fields_set and self.micro_batch_tokens is not None:
                raise ValueError(
                    f"micro_batches = {self.micro_batches} and micro_batch_tokens = {self.micro_batch_tokens}: "
                    "choose one way to split a step"
                )
            self.micro_batch_tokens = None  # a count instead of the default budget
            self.model_fields_set.discard("micro_batch_tokens")
        if self.minibatches > self.samples_per_step:
            raise ValueError(
                f"minibatches = {self.minibatches} is more than samples_per_step = {self.samples_per_step}"
            )
        if self.micro_batches is not None and self.micro_batches > self.samples_per_step:
            raise ValueError(
                f"micro_batches = {self.micro_batches} is more than samples_per_step = {self.samples_per_step}"
            )
        return self
