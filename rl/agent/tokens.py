"""The trajectory as the learner will see it: one list of token ids, never
re-tokenised.

    prompt ids      the chat template of the first messages (rl.model.chat_ids), loss_mask 0
    sampled ids     exactly what the generator returned, loss_mask 1, with the
                    behaviour log-prob and the weight version of each
    observation     ids that continue the conversation with a user turn,
                    loss_mask 0, log-prob 0, version -1

Observation ids are computed on a fixed base ("fixed base", as SkyRL does):
the template of a dummy two-turn conversation, and the same conversation with
the observation appended; the ids after the base are what an observation
adds. The ids before them never change, so the ids the learner trains on are
the ids that were sampled. The template's separator after the end-of-turn
token (a newline for ChatML) is taken from the base, and an end-of-turn token
is added (masked) when a reply was cut by the token limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl.model import chat_ids, stop_ids

_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class ObservationTokens:
    """Turns observation text into the ids that follow a sampled reply."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        base = chat_ids(tokenizer, _BASE, add_generation_prompt=False)
        ends = stop_ids(tokenizer)
        last_end = max(i for i, t in enumerate(base) if t in ends)
        self.end_id = base[last_end]
        """The template's end-of-turn token."""
        self.tail = base[last_end + 1 :]
        """What the template puts after an end-of-turn token (ChatML: a newline)."""
        self.base = base
        self.ends = set(ends)

    def after_reply(self, sampled: list[int], text: str, role: str = "user") -> list[int]:
        """Ids to append after `sampled` (a reply) for the turn `text` (a
        `user` message, or a `tool` result where the template has tools),
        ending with the generation prompt of the next reply."""
        full = chat_ids(self.tokenizer, [*_BASE, {"role": role, "content": text}], add_generation_prompt=True)
        if full[: len(self.base)] != self.base:
            raise ValueError("the chat template rewrites earlier turns: observations cannot be appended")
        closing = [] if sampled and sampled[-1] in self.ends else [self.end_id]
        return closing + self.tail + full[len(self.base) :]


@dataclass
class Trajectory:
    """Token ids of one episode, with what the learner needs per token."""

    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """Weight version that sampled each token; -1 where the policy did not."""

    @classmethod
    def start(cls, prompt_ids: list[int]) -> Trajectory:
        t = cls()
        t.add_context(prompt_ids)
        return t

    def add_context(self, ids: list[int]) -> None:
        """Prompt or observation ids: not trained on."""
        self.tokens += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_sampled(self, ids: list[int], logprobs: list[float], version: int) -> None:
        """Exactly what the generator sampled."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} log-probs")
        self.tokens += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += [version] * len(ids)

    def __len__(self) -> int:
        return len(self.tokens)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "tokens": np.asarray(self.tokens, dtype=np.int32),
            "loss_mask": np.asarray(self.loss_mask, dtype=np.uint8),
            "logprobs": np.asarray(self.logprobs, dtype=np.float32),
            "versions": np.asarray(self.versions, dtype=np.int32),
        }
