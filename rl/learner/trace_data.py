"""SFT on tool traces: what a step trains on when `[learner.loss] type =
"sft"`, `source = "traces"`.

The traces file is what `sarl tasks traces` writes: each line a correct
trajectory of a tool task (rl.tasks.traces), replayed in its environment,
with the episode's token ids and loss mask as a rollout stores them: the
chat template, the tool protocol and the observations are the rollouts'
own, and only the policy's replies (mask 1) are trained; the prompt and
the tools' results are context. The ids belong to one tokenizer: the
learner refuses a file made with another (`tokenizer`, its fingerprint).
Steps take the traces in passes (rl.learner.references.Epochs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rl.learner.references import Epochs
from rl.model import tokenizer_fingerprint
from rl.store import Sample
from rl.tasks.traces import read_traces


class Traces(Epochs):
    def __init__(self, path: Path, tokenizer: Any, seed: int, max_tokens: int = 4096):
        self.traces = read_traces(path)
        mine = tokenizer_fingerprint(tokenizer)
        other = next((t for t in self.traces if t["tokenizer"] != mine), None)
        if other is not None:
            raise ValueError(
                f"{path}: trace of {other['task_id']} was tokenised by another tokenizer ({other['tokenizer']}, "
                f"this model's is {mine}): write the traces again with `sarl tasks traces --model` this model"
            )
        self.seed, self.max_tokens = seed, max_tokens
        self._orders = {}

    def __len__(self) -> int:
        return len(self.traces)

    def item(self, k: int, index: int) -> Sample:
        t = self.traces[k]
        ids = np.asarray(t["tokens"][: self.max_tokens], dtype=np.int32)
        return Sample(
            t["task_id"],
            index,
            0,
            ids,
            np.asarray(t["loss_mask"][: self.max_tokens], dtype=np.uint8),
            np.zeros(len(ids), dtype=np.float32),
            reward=1.0,
            episode_id=f"trace/{index}",
        )
