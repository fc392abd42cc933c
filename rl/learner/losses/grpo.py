"""GRPO: group-normalised advantages, PPO clipping, each sample's token mean.

    A_i   = (r_i - mean_g) / (std_g + eps)
    loss  = mean_i [ sum_t m_it w_it max(-rho_it A_i, -clip(rho_it, 1-eps, 1+eps) A_i) / sum_t m_it ]
    rho   = exp(logp - old_logp)

Hand check: one sample, two tokens, rho = 1, A = 1, w = 1: loss = -1, and
the gradient of each token's logp is -1/2 (the token mean).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from rl.learner.losses.base import LossBase, LossInputs, LossOutput, clipped_surrogate, sample_mean, with_kl

if TYPE_CHECKING:
    import torch


class GRPO(LossBase):
    """Group Relative Policy Optimisation (DeepSeekMath)."""

    type: Literal["grpo"] = "grpo"
    """Loss tag: `grpo`."""
    unit: ClassVar[str] = "samples"
    """What the loss averages over: a step of micro-batches is normalised by the same."""
    clip: float = Field(0.2, gt=0)
    """PPO clip range eps, both sides."""
    leave_one_out: bool = False
    """RLOO advantages (r_i - mean of the others) instead of group mean and std."""

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        from rl.learner.advantages import group_relative, leave_one_out

        return leave_one_out(rewards, groups) if self.leave_one_out else group_relative(rewards, groups, std=True)

    def compute(self, x: LossInputs) -> LossOutput:
        import torch

        ratio = torch.exp(x.logp - x.old_logp)
        per_token, clipped = clipped_surrogate(ratio, x.advantages[:, None], self.clip, self.clip)
        metrics = {"clip_frac": float(sample_mean(clipped, x.mask))}
        loss = with_kl(sample_mean(per_token * x.weights, x.mask), x, self.kl_coef, metrics)
        return LossOutput(loss, metrics)
