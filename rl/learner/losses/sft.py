"""SFT: the negative log-likelihood of the trained tokens, token mean.

    loss = - sum_it m_it logp_it / sum_it m_it

`source = "passing"` trains on committed rollouts that passed
(rejection-sampling fine-tuning); the learner drops the others.
`source = "references"` trains on the tasks' reference solutions of
`tasks_file`, each written as the agent's protocol wants a reply (the
whole function in one python block), after the same prompt the rollouts
see (rl.learner.references). Hand check: two tokens of probability 0.5
each: loss = ln 2 = 0.693.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from rl.learner.losses.base import LossBase, LossInputs, LossOutput, token_mean

if TYPE_CHECKING:
    import torch


class SFT(LossBase):
    """Supervised fine-tuning, with the same loop, checkpoints and publishing."""

    type: Literal["sft"] = "sft"
    """Loss tag: `sft`."""
    unit: ClassVar[str] = "tokens"
    """What the loss averages over: a step of micro-batches is normalised by the same."""
    source: Literal["passing", "references", "traces"] = "passing"
    """What to train on: committed rollouts that passed, the reference
    solutions of `tasks_file`, or the tool traces of `traces_file`."""
    tasks_file: Path | None = None
    """Tasks whose references `source = "references"` trains on (JSONL, as
    `sarl tasks validate` reads); relative to the config file."""
    traces_file: Path | None = None
    """`source = "traces"`: the tool traces to train on, as `sarl tasks
    traces` writes them (each an episode's token ids and loss mask, replayed
    to reward 1 in its environment; rl.learner.trace_data); relative to the
    config file. Only the policy's replies are trained, never the prompt or
    the tools' results. Made with the model's own tokenizer."""
    repairs: float = Field(0.0, ge=0.0, le=1.0)
    """`source = "references"`: the share of samples given as a repair trace
    where the task carries one (generated tasks do: `metadata.repair`): a
    wrong first attempt (not trained on), what running it on the visible
    examples showed (the agent's own observation), then the reference (trained
    on). It teaches the multi-turn protocol: read the feedback, fix the code."""

    @model_validator(mode="after")
    def _source(self) -> SFT:
        if self.source == "references" and self.tasks_file is None:
            raise ValueError("tasks_file: source = 'references' needs the task file whose references to train on")
        if self.source != "references" and self.tasks_file is not None:
            raise ValueError("tasks_file: only source = 'references' reads a task file")
        if self.source != "references" and self.repairs:
            raise ValueError("repairs: only source = 'references' builds repair traces")
        if (self.source == "traces") != (self.traces_file is not None):
            raise ValueError("traces_file: source = 'traces' needs it, and only it reads one")
        return self

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.ones_like(rewards)

    def compute(self, x: LossInputs) -> LossOutput:

        return LossOutput(token_mean(-x.logp, x.mask), {})
