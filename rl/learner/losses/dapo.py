"""DAPO (Yu et al., 2025): clip-higher, token-level normalisation, and an
overlong penalty. Dynamic sampling is the rollout worker's
(`rollout.dynamic_sampling`).

    A_i     = (r'_i - mean_g) / (std_g + eps),  r' = r + overlong(len_i)
    loss    = sum_it m_it w_it max(-rho A_i, -clip(rho, 1-eps_low, 1+eps_high) A_i) / sum_it m_it
    overlong(L) = 0                          if L <= max_tokens - cache
                = (max_tokens - cache - L) / cache   up to max_tokens
                = -1                         beyond

Hand check of the clip: A = 1, rho = 1.5, eps_high = 0.28: the token
contributes -1.28 (clipped); with A = -1 it contributes 1.5 (the min keeps
the pessimistic, unclipped term).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from rl.learner.losses.base import LossBase, LossInputs, LossOutput, clipped_surrogate, token_mean, with_kl

if TYPE_CHECKING:
    import torch


class DAPO(LossBase):
    """Decoupled clip and dynamic sampling policy optimisation."""

    type: Literal["dapo"] = "dapo"
    """Loss tag: `dapo`."""
    unit: ClassVar[str] = "tokens"
    """What the loss averages over: a step of micro-batches is normalised by the same."""
    clip_low: float = Field(0.2, gt=0)
    """Lower clip range eps_low."""
    clip_high: float = Field(0.28, gt=0)
    """Upper clip range eps_high (clip-higher: > clip_low keeps exploring)."""
    max_tokens: int = Field(1024, ge=1)
    """Sampled tokens per sample beyond which the overlong penalty is -1."""
    overlong_cache: int = Field(0, ge=0)
    """Width of the soft penalty ramp before `max_tokens`; 0: no overlong penalty."""

    def overlong(self, lengths: torch.Tensor) -> torch.Tensor:
        import torch

        if self.overlong_cache == 0:
            return torch.zeros_like(lengths, dtype=torch.float32)
        start = self.max_tokens - self.overlong_cache
        ramp = (start - lengths.float()) / self.overlong_cache
        return torch.where(lengths <= start, 0.0, torch.where(lengths <= self.max_tokens, ramp, -1.0))

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        from rl.learner.advantages import group_relative

        return group_relative(rewards + self.overlong(lengths).to(rewards.dtype), groups, std=True)

    def compute(self, x: LossInputs) -> LossOutput:
        import torch

        ratio = torch.exp(x.logp - x.old_logp)
        per_token, clipped = clipped_surrogate(ratio, x.advantages[:, None], self.clip_low, self.clip_high)
        metrics = {"clip_frac": float(token_mean(clipped, x.mask))}
        loss = with_kl(token_mean(per_token * x.weights, x.mask), x, self.kl_coef, metrics)
        return LossOutput(loss, metrics)
