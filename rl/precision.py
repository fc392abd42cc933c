"""What this machine computes fast in: `auto` precision, read off the
hardware where the work runs, never assumed.

bf16 pays where the hardware multiplies in it: a CUDA device that supports
it, or a CPU with `avx512_bf16` or `amx_bf16`. Measured on a CPU with both
(docs/benchmarks.md): a SmolLM2-135M training step 3.0x faster under bf16
autocast than in float32, and vLLM decoding 2.2x faster in bf16. A CPU
without them emulates bf16 and runs slower than float32 (an earlier machine
of this kind decoded bf16 2-3x slower in vLLM): there `auto` is float32.

`SARL_CPUINFO` names another file to read the CPU's flags from (a test hides
a flag with it); it is read in each process, so a role started with it set
decides as that file says.
"""

from __future__ import annotations

import os
from functools import cache

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags of native bf16 arithmetic: either makes bf16 faster than float32."""


@cache
def cpu_flags() -> frozenset[str]:
    """The flags of this machine's first CPU (`/proc/cpuinfo`, or `$SARL_CPUINFO`)."""
    path = os.environ.get("SARL_CPUINFO", "/proc/cpuinfo")
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def bf16_fast() -> bool:
    """Whether bf16 is faster than float32 where this process computes: the
    CUDA device it would use, or the CPU."""
    if cuda():
        import torch

        return bool(torch.cuda.is_bf16_supported())
    return any(f in cpu_flags() for f in BF16_CPU_FLAGS)


def engine_dtype(requested: str) -> str:
    """The dtype an inference engine computes in: `requested`, or for
    `auto` bfloat16 where it is fast, float16 on a CUDA device without it,
    and float32 on a CPU without it."""
    if requested != "auto":
        return requested
    if bf16_fast():
        return "bfloat16"
    return "float16" if cuda() else "float32"


def learner_precision(requested: str) -> str:
    """How the learner computes: `requested`, or for `auto` `bf16` (bf16
    weights, float32 master weights in the optimizer) where bf16 is fast,
    else float32. Measured on 2 cores with bf16, a SmolLM2-135M step of 8
    samples: float32 7.6 s, bf16 autocast 4.3 s (it casts every float32
    weight at every forward), bf16 weights 3.7-4.0 s; under LoRA, autocast
    3.3-3.6 s and bf16 weights 3.0 s."""
    if requested != "auto":
        return requested
    return "bf16" if bf16_fast() else "float32"


def describe() -> str:
    """One line on what `auto` sees here, for logs."""
    if cuda():
        import torch

        return f"cuda {torch.cuda.get_device_name()}: bf16 {'supported' if bf16_fast() else 'not supported'}"
    have = [f for f in BF16_CPU_FLAGS if f in cpu_flags()]
    return f"cpu: {', '.join(have) if have else 'no bf16 instructions'}"
