"""What every loss takes and gives, and the pieces they share.

Shapes: B samples, T tokens (padded). Per token, `logp` is log pi_theta of
the token under the weights being trained (with gradient), `old_logp` is
the same under the weights at the start of the step (no gradient: the
proximal policy of decoupled PPO), `behaviour_logp` is what the generator
recorded when it sampled the token. `mask` is 1 on the tokens the policy
sampled. `weights` is the off-policy correction (rl.learner.correction):
truncated importance weights old / behaviour, 0 on masked-out tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from rl.schema import Section

if TYPE_CHECKING:
    import torch


@dataclass
class LossInputs:
    logp: torch.Tensor
    """[B, T] log-prob of each token under the trained weights (with grad)."""
    old_logp: torch.Tensor
    """[B, T] the same at the step's start (no grad)."""
    behaviour_logp: torch.Tensor
    """[B, T] recorded by the generator when it sampled the token."""
    mask: torch.Tensor
    """[B, T] float, 1 on sampled tokens."""
    advantages: torch.Tensor
    """[B] one advantage per sample (rl.learner.advantages)."""
    weights: torch.Tensor
    """[B, T] off-policy correction per token (no grad); ones when off."""
    ref_logp: torch.Tensor | None = None
    """[B, T] under the reference model, when a KL term is on."""


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


class LossBase(Section):
    """Fields every policy loss has."""

    unit: ClassVar[str] = "tokens"
    """`tokens` or `samples`: what the loss averages over."""

    kl_coef: float = Field(0.0, ge=0)
    """Weight of the k3 KL to the reference model, the base model frozen
    (0: off, and no reference model is loaded)."""

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[B] from the rewards, group ids and sampled-token counts of the samples."""

        raise NotImplementedError

    def compute(self, x: LossInputs) -> LossOutput:

        raise NotImplementedError


def token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over every trained token of the batch / their number (DAPO's)."""

    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def sample_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each sample's token mean, then the mean over samples (GRPO's)."""

    per_sample = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_sample.mean()


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's -min(r A, clip(r, 1 - low, 1 + high) A) per element, and where the clip bound."""
    import torch

    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - low, 1.0 + high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: e^(ref - logp) - (ref - logp) - 1 >= 0."""
    import torch

    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def with_kl(loss: torch.Tensor, x: LossInputs, coef: float, metrics: dict[str, float]) -> torch.Tensor:
    """`loss` + coef x token mean of k3 to the reference; both terms go to `metrics`."""

    metrics["policy_loss"] = float(loss.detach())
    if coef == 0.0 or x.ref_logp is None:
        return loss
    kl = token_mean(k3(x.logp, x.ref_logp), x.mask)
    metrics["kl_ref"] = float(kl.detach())
    return loss + coef * kl
