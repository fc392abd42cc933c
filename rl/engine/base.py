"""The engine interface: token ids in, sampled token ids and their
log-probs out (the backends are rl.engine.vllm and rl.engine.hf)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from rl.engine.config import SamplingParams


class BadRequest(ValueError):
    """A request the engine cannot serve; the message names what is wrong."""


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """log p(token) under the weights that sampled it, one per token."""
    finish_reason: str
    """"stop" (end of turn, stop string or stop token) or "length"."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Engine:
    """What a generator serves with."""

    backend = "?"
    version = 0
    """The weight version loaded: a version of the store, or 0 for the base
    checkpoint before any is loaded (the learner publishes the base as 0)."""
    vocab_size = 0
    max_model_len = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions for each prompt, in order."""
        raise NotImplementedError

    step_tokens = 0
    """New tokens one engine step takes in without splitting a prompt over
    steps (vLLM's `max_num_batched_tokens`); 0: no such limit."""
    kv_tokens = 0
    """Tokens its KV cache holds, all sequences together; 0: not known."""

    continuous = False
    """True when the engine offers `add` and `step`: requests join and leave
    the running batch at any decoding step (vLLM). Otherwise the service runs
    whole batches with `generate` (HF)."""

    def add(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        raise NotImplementedError

    def step(self) -> list[tuple[str, list[Completion]]]:
        raise NotImplementedError

    def load_version(self, store: str | os.PathLike[str], version: int) -> None:
        """Replace the weights with `version` of the store at `store`. A
        version that is corrupt, missing or does not fit the model raises
        `StoreError` before any weight changes."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def check_fits(weights: Any, version: int, base: str | os.PathLike[str]) -> None:
    """Every checksum of weight `version` verified, and a version of LoRA
    adapters checked to fit the base model in folder `base`: a StoreError
    that says why otherwise, raised before an engine's weights change."""
    from rl.engine.lora import check_fits as adapter_fits
    from rl.store import StoreError

    _, tensors = weights.load(version, verify=True)
    if weights.adapter(version) is not None:
        try:
            adapter_fits(tensors, base)
        except ValueError as e:
            raise StoreError(f"version {version}: {e}") from None


def check_prompts(prompts: Any, params: SamplingParams, vocab_size: int, max_model_len: int) -> list[list[int]]:
    """Validate the prompts of a request: lists of token ids within the
    vocabulary, short enough for `max_model_len` with `max_tokens` to come;
    and the stop token ids, within the vocabulary too."""
    for i, t in enumerate(params.stop_token_ids):
        if t >= vocab_size:
            raise BadRequest(f"sampling.stop_token_ids[{i}]: {t} is not a token id (0 <= id < {vocab_size})")
    if not isinstance(prompts, list) or not prompts:
        raise BadRequest("prompts: expected a non-empty list of token id lists")
    for i, p in enumerate(prompts):
        if not isinstance(p, list) or not p:
            raise BadRequest(f"prompts[{i}]: expected a non-empty list of token ids")
        for j, t in enumerate(p):
            if type(t) is not int or not 0 <= t < vocab_size:
                raise BadRequest(f"prompts[{i}][{j}]: {t!r} is not a token id (0 <= id < {vocab_size})")
        if len(p) + params.max_tokens > max_model_len:
            raise BadRequest(
                f"prompts[{i}]: {len(p)} tokens + max_tokens {params.max_tokens} exceeds max_model_len {max_model_len}"
            )
    return prompts
