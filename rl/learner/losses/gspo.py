"""GSPO (Zheng et al., 2025): the ratio and the clip are per sequence.

    s_i   = exp( sum_t m_it (logp - old_logp) / sum_t m_it )   (geometric mean ratio)
    loss  = mean_i max(-s_i A_i, -clip(s_i, 1-eps_low, 1+eps_high) A_i)

Sequence ratios move far less than token ones, so the clip range is small
(3e-4 / 4e-4 in the paper). Hand check: two tokens with log-ratios 0.2 and
0.0: s = exp(0.1) = 1.105; with A = 1 and eps_high = 4e-4 the sample
contributes -1.0004.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from rl.learner.losses.base import LossBase, LossInputs, LossOutput, clipped_surrogate, with_kl

if TYPE_CHECKING:
    import torch


class GSPO(LossBase):
    """Group Sequence Policy Optimisation."""

    type: Literal["gspo"] = "gspo"
    """Loss tag: `gspo`."""
    unit: ClassVar[str] = "samples"
    """What the loss averages over: a step of micro-batches is normalised by the same."""
    clip_low: float = Field(3e-4, gt=0)
    """Lower clip range of the sequence ratio."""
    clip_high: float = Field(4e-4, gt=0)
    """Upper clip range of the sequence ratio."""

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        from rl.learner.advantages import group_relative

        return group_relative(rewards, groups, std=True)

    def compute(self, x: LossInputs) -> LossOutput:
        import torch

        n = x.mask.sum(-1).clamp(min=1.0)
        # the correction weights enter the sequence ratio as their geometric mean too
        log_w = torch.log(x.weights.clamp(min=1e-12)) * x.mask
        log_s = ((x.logp - x.old_logp) * x.mask).sum(-1) / n + log_w.sum(-1) / n
        per_sample, clipped = clipped_surrogate(torch.exp(log_s), x.advantages, self.clip_low, self.clip_high)
        live = (x.mask.sum(-1) > 0).float()
        loss = (per_sample * live).sum() / live.sum().clamp(min=1.0)
        metrics = {"clip_frac": float((clipped * live).sum() / live.sum().clamp(min=1.0))}
        return LossOutput(with_kl(loss, x, self.kl_coef, metrics), metrics)
