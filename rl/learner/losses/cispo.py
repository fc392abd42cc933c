"""CISPO (MiniMax-M1, 2025): clip the importance weight, never drop a
token's gradient.

    loss = - sum_it m_it sg(clip(rho_it, 1-eps_low, 1+eps_high)) w_it A_i logp_it / sum_it m_it

PPO's clip zeroes the gradient of tokens whose ratio left the band (often
the rare, decisive ones); here every token keeps a gradient, weighted by its
clipped ratio. Hand check: rho = 1, A = 2, one token: loss = -2 logp, and
d loss / d logp = -2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from rl.learner.losses.base import LossBase, LossInputs, LossOutput, token_mean, with_kl

if TYPE_CHECKING:
    import torch


class CISPO(LossBase):
    """Clipped importance sampling policy optimisation."""

    type: Literal["cispo"] = "cispo"
    """Loss tag: `cispo`."""
    unit: ClassVar[str] = "tokens"
    """What the loss averages over: a step of micro-batches is normalised by the same."""
    clip_low: float = Field(1.0, ge=0)
    """The weight is at least 1 - clip_low (1.0: no lower bound)."""
    clip_high: float = Field(4.0, gt=0)
    """The weight is at most 1 + clip_high."""

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        from rl.learner.advantages import group_relative

        return group_relative(rewards, groups, std=True)

    def compute(self, x: LossInputs) -> LossOutput:
        import torch

        ratio = torch.exp(x.logp - x.old_logp).detach()
        weight = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        per_token = -weight * x.weights * x.advantages[:, None] * x.logp
        metrics = {"clip_frac": float(token_mean((weight != ratio).float(), x.mask))}
        return LossOutput(with_kl(token_mean(per_token, x.mask), x, self.kl_coef, metrics), metrics)
