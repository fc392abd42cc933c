"""`sarl bench generate`: the vLLM backend against the HF backend, same
weights, dtype, prompts and sampling, in one process and one run.

* tokens per second at batch 1 and batch 8 (chat prompts, greedy, every row
  made to run `max_tokens` with `ignore_eos`), each after a warm-up batch
  (none with `--quick`), median of the repetitions;
* reload: loading a new weight version from the store into the live vLLM
  engine (mapped, every checksum verified, pushed into the worker's model,
  prefix cache dropped), against loading the same weights from a safetensors
  checkpoint folder on the same disk into the same live engine, with vLLM's
  own `reload_weights(weights_path=...)`. A second baseline reads the
  safetensors file into private torch tensors (a copy of every byte; no engine);
* agreement: the two backends' greedy completions of the same prompts (up to
  40 tokens, 24 with `--quick`, stopping at EOS): how many rows have the same tokens and finish
  reason, and the largest log-prob difference on those rows. A speed ratio
  means something only if the two compute the same thing; in float32 they
  must agree on every row, in bf16 kernels' rounding may part them;
* engine start: each backend's, and (not with `--quick`) vLLM's with its
  engine core the other way (`engine_core`: in this process, or in a process
  of its own), its start and batch-8 speed beside the default's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rl.layout import RunLayout

QUESTIONS = [
    "Write a Python function that reverses a string.",
    "Explain what a hash map is.",
    "Write a function to check whether a number is prime.",
    "What is the capital of France?",
    "Write a haiku about compilers.",
    "How do I read a file line by line in Python?",
    "Sort a list of dictionaries by a key.",
    "What does the `yield` keyword do?",
]


def _tok_s(engine: Any, prompts: list[list[int]], params: Any, reps: int, warm: bool) -> float:
    if warm:
        engine.generate(prompts, params)
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = engine.generate(prompts, params)
        dt = time.perf_counter() - t0
        rates.append(sum(len(c.token_ids) for row in out for c in row) / dt)
    return statistics.median(rates)


def _greedy(engine: Any, prompts: list[list[int]], max_tokens: int) -> list[Any]:
    from rl.engine.config import SamplingParams

    return [row[0] for row in engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))]


def _agreement(hf: list[Any], vllm: list[Any]) -> tuple[int, float]:
    """Rows with the same tokens and finish reason, and their largest log-prob difference."""
    pairs = zip(hf, vllm, strict=True)
    same = [(h, v) for h, v in pairs if (h.token_ids, h.finish_reason) == (v.token_ids, v.finish_reason)]
    diff = max((abs(a - b) for h, v in same for a, b in zip(h.logprobs, v.logprobs, strict=True)), default=0.0)
    return len(same), diff


def bench_generate(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The figures, and the lines that show them beside their baselines."""
    from tqdm import tqdm

    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig, SamplingParams, VLLMEngineConfig
    from rl.engine.vllm import VLLMEngine
    from rl.model import ModelConfig, chat_ids, checkpoint, load_tokenizer

    reps = 1 if args.quick else 3
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the figures
    model = ModelConfig(dtype=args.dtype)
    bar = tqdm(total=6, desc="bench generate", file=sys.stderr)
    ckpt = checkpoint(model)
    tok = load_tokenizer(ckpt)
    prompts = [chat_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    # --quick: a check that the command and both engines work, not a measurement
    params = SamplingParams(temperature=0, max_tokens=16 if args.quick else 64, ignore_eos=True)
    greedy_tokens = 24 if args.quick else 40
    r: dict[str, Any] = {"dtype": args.dtype, "max_tokens": params.max_tokens, "repetitions": reps}
    r["greedy_max_tokens"] = greedy_tokens

    t0 = time.perf_counter()
    hf = make_engine(HFEngineConfig(), model)
    r["hf_start_s"] = time.perf_counter() - t0
    r["hf_tok_s_b1"] = _tok_s(hf, prompts[:1], params, reps, warm=not args.quick)
    bar.update()
    r["hf_tok_s_b8"] = _tok_s(hf, prompts, params, reps, warm=not args.quick)
    hf_greedy = _greedy(hf, prompts, greedy_tokens)
    bar.update()
    hf.close()
    del hf

    t0 = time.perf_counter()
    vllm = make_engine(VLLMEngineConfig(max_model_len=1024), model)
    assert isinstance(vllm, VLLMEngine)
    r["vllm_start_s"] = time.perf_counter() - t0
    bar.update()
    r["vllm_tok_s_b1"] = _tok_s(vllm, prompts[:1], params, reps, warm=not args.quick)
    bar.update()
    r["vllm_tok_s_b8"] = _tok_s(vllm, prompts, params, reps, warm=not args.quick)
    r["greedy_rows"] = len(prompts)
    r["greedy_same_rows"], r["greedy_max_logprob_diff"] = _agreement(hf_greedy, _greedy(vllm, prompts, greedy_tokens))
    bar.update()

    with tempfile.TemporaryDirectory(prefix="sarl-bench-generate-", dir=args.dir) as tmp:
        r.update(_reload_times(vllm, ckpt, args.dtype, reps, Path(tmp)))
    r["vllm_core"] = "in-process" if vllm.in_process else "own-process"
    vllm.close()
    del vllm
    if not args.quick:
        r.update(_other_core(r["vllm_core"], model, prompts, params, reps))
    bar.update()
    bar.close()
    r["speedup_b1"] = r["vllm_tok_s_b1"] / r["hf_tok_s_b1"]
    r["speedup_b8"] = r["vllm_tok_s_b8"] / r["hf_tok_s_b8"]
    r["reload_ratio"] = r["reload_s"] / r["safetensors_load_s"]
    r = {k: round(v, 3) if isinstance(v, float) and "logprob" not in k else v for k, v in r.items()}
    return r, _generate_lines(r, args.quick)


def _other_core(core: str, model: Any, prompts: list[list[int]], params: Any, reps: int) -> dict[str, Any]:
    """vLLM with its engine core the other way (`engine_core`): its start and
    batch-8 speed, the baseline of the default's."""
    from rl.engine import make_engine
    from rl.engine.config import VLLMEngineConfig

    other = "own-process" if core == "in-process" else "in-process"
    t0 = time.perf_counter()
    engine = make_engine(VLLMEngineConfig(max_model_len=1024, engine_core=other), model)
    start = time.perf_counter() - t0
    tok_s = _tok_s(engine, prompts, params, reps, warm=True)
    engine.close()
    return {"vllm_other_core": other, "vllm_other_start_s": start, "vllm_other_tok_s_b8": tok_s}


def _reload_times(vllm: Any, ckpt: Path, dtype: str, reps: int, tmp: Path) -> dict[str, float]:
    """Loading a published version into the live engine, beside loading the
    same weights from a safetensors file (into the engine, and into plain
    torch tensors); medians in seconds. Versions 1 and 2 alternate, so that
    every load changes the weights."""
    import torch
    from safetensors.torch import load_file, save_file

    from rl.store.weights import WeightStore

    weights = load_file(str(ckpt / "model.safetensors"))
    store = RunLayout(tmp).store_path  # a run directory of its own
    ws = WeightStore(store)
    ws.publish(weights, version=1, dtype=dtype)
    ws.publish({k: v * 1.01 for k, v in weights.items()}, version=2, dtype=dtype)
    ref = tmp / "safetensors"
    ref.mkdir()
    save_file({k: v.to(getattr(torch, dtype)).contiguous() for k, v in weights.items()}, str(ref / "model.safetensors"))
    reload, st, st_torch = [], [], []
    for k in range(reps + 1):  # the first round warms the page cache and the code paths
        t0 = time.perf_counter()
        vllm.load_version(store, 1 + k % 2)
        t1 = time.perf_counter()
        vllm.load_checkpoint(ref)
        t2 = time.perf_counter()
        copied = {k: v.clone() for k, v in load_file(str(ref / "model.safetensors")).items()}
        t3 = time.perf_counter()
        if k:
            reload.append(t1 - t0)
            st.append(t2 - t1)
            st_torch.append(t3 - t2)
        del copied
    return {
        "weights_mb": round((ref / "model.safetensors").stat().st_size / 1e6, 1),
        "reload_s": statistics.median(reload),
        "safetensors_load_s": statistics.median(st),
        "safetensors_to_torch_s": statistics.median(st_torch),
    }


def _generate_lines(r: dict[str, Any], quick: bool) -> list[str]:
    lines: list[str] = []
    lines.append(
        f"generate: SmolLM2-135M-Instruct, {r['dtype']}, {r['max_tokens']} tokens per row, median of {r['repetitions']}"
        + (", no warm-up [--quick: not a measurement]" if quick else "")
    )
    lines.append(
        f"  batch 1   vllm {r['vllm_tok_s_b1']:8.1f} tok/s   hf {r['hf_tok_s_b1']:8.1f} tok/s   {r['speedup_b1']}x"
    )
    lines.append(
        f"  batch 8   vllm {r['vllm_tok_s_b8']:8.1f} tok/s   hf {r['hf_tok_s_b8']:8.1f} tok/s   "
        f"{r['speedup_b8']}x (target >= 1.5)"
    )
    lines.append(
        f"  reload {r['weights_mb']} MB into the live engine {r['reload_s']:.3f} s   "
        f"from safetensors {r['safetensors_load_s']:.3f} s   {r['reload_ratio']}x (target <= 2)"
    )
    lines.append(f"  (safetensors file copied into torch tensors, no engine: {r['safetensors_to_torch_s']:.3f} s)")
    lines.append(
        f"  greedy agreement (up to {r['greedy_max_tokens']} tokens): {r['greedy_same_rows']} of "
        f"{r['greedy_rows']} rows the same tokens, "
        f"largest log-prob difference {r['greedy_max_logprob_diff']:.2e}"
    )
    lines.append(f"  engine start: vllm {r['vllm_start_s']:.1f} s ({r['vllm_core']} core), hf {r['hf_start_s']:.1f} s")
    if "vllm_other_start_s" in r:
        lines.append(
            f"  vllm, core {r['vllm_other_core']} (baseline): start {r['vllm_other_start_s']:.1f} s, "
            f"batch 8 {r['vllm_other_tok_s_b8']:.1f} tok/s"
        )
    return lines
