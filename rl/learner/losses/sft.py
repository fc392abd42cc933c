"""SFT: the negative log-likelihood of the trained tokens, token mean.

    loss = - sum_it m_it logp_it / sum_it m_it

`source = "passing"` trains on committed rollouts that passed
(rejection-sampling fine-tuning); the learner drops the others. Hand check: two tokens of
probability 0.5 each: loss = ln 2 = 0.693.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from rl.learner.losses.base import LossBase, LossInputs, LossOutput, token_mean

if TYPE_CHECKING:
    import torch


class SFT(LossBase):
    """Supervised fine-tuning, with the same loop, checkpoints and publishing."""

    type: Literal["sft"] = "sft"
    """Loss tag: `sft`."""
    unit: ClassVar[str] = "tokens"
    """What the loss averages over: a step of micro-batches is normalised by the same."""
    source: Literal["passing"] = "passing"
    """What to train on: committed rollouts that passed (training on the
    tasks' references is not built yet)."""

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.ones_like(rewards)

    def compute(self, x: LossInputs) -> LossOutput:

        return LossOutput(token_mean(-x.logp, x.mask), {})
