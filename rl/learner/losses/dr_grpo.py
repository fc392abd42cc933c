"""Dr. GRPO: GRPO without its two biases (Liu et al., 2025).

    A_i   = r_i - mean_g                        (no division by the std)
    loss  = sum_it m_it w_it max(-rho A_i, -clip(rho) A_i) / (B x max_tokens)

The constant denominator removes the length normalisation, so long wrong
answers are not penalised less per token than short ones.

Hand check: B = 2, max_tokens = 4, sample 0 has 2 tokens with A = 1, sample
1 has 1 token with A = -1, rho = 1: loss = (-2 + 1) / 8 = -0.125.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from rl.learner.losses.base import LossBase, LossInputs, LossOutput, clipped_surrogate, token_mean, with_kl

if TYPE_CHECKING:
    import torch


class DrGRPO(LossBase):
    """GRPO with no std normalisation and a constant length normaliser."""

    type: Literal["dr_grpo"] = "dr_grpo"
    """Loss tag: `dr_grpo`."""
    unit: ClassVar[str] = "samples"
    """What the loss averages over: a step of micro-batches is normalised by the same."""
    clip: float = Field(0.2, gt=0)
    """PPO clip range eps, both sides."""
    max_tokens: int = Field(1024, ge=1)
    """The constant that divides each sample's token sum (the generation budget)."""
    leave_one_out: bool = False
    """RLOO advantages instead of r - group mean."""

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        from rl.learner.advantages import group_relative, leave_one_out

        return leave_one_out(rewards, groups) if self.leave_one_out else group_relative(rewards, groups, std=False)

    def compute(self, x: LossInputs) -> LossOutput:
        import torch

        ratio = torch.exp(x.logp - x.old_logp)
        per_token, clipped = clipped_surrogate(ratio, x.advantages[:, None], self.clip, self.clip)
        loss = (per_token * x.weights * x.mask).sum() / (x.mask.shape[0] * self.max_tokens)
        metrics = {"clip_frac": float(token_mean(clipped, x.mask))}
        return LossOutput(with_kl(loss, x, self.kl_coef, metrics), metrics)
