"""`sarl bench endpoint`: requests/s and tokens/s through the OpenAI-compatible
endpoint against the native token protocol, on the same engine in one run.

One engine (vLLM by default) serves in a generator service of this
process, announced as a generator announces itself. Three ways reach it:

* native: `GeneratorClient` with chat-template token ids (what a rollout
  worker does; the client renders the prompt);
* openai, `sarl serve`: the official `openai` client against the gateway
  that puts requests straight into the service's queue;
* openai, in a run: the official client against a gateway that reaches the
  generator through `GeneratorClient` (one more local HTTP hop: what a
  harness episode's program goes through).

Each request is one chat question, greedy, `max_tokens` long at most, so
every way samples the same tokens; each concurrency (1 and 16) runs the
three ways in turn, `reps` times, and keeps each one's median.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rl.bench.engine_throughput import QUESTIONS


def _run(one: Any, concurrency: int, requests: int) -> tuple[float, float]:
    """(requests/s, tokens/s) of `requests` calls of `one(i) -> tokens`, `concurrency` at a time."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        tokens = sum(ex.map(one, range(requests)))
    dt = time.perf_counter() - t0
    return requests / dt, tokens / dt


def _native(client: Any, tok: Any, max_tokens: int) -> Callable[[int], int]:
    """One request on the generators' own token protocol: its reply's tokens."""
    from rl.engine.config import SamplingParams
    from rl.model import chat_ids

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    lock = threading.Lock()

    def one(i: int) -> int:
        with lock:  # the tokenizer is not safe across threads
            ids = chat_ids(tok, [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
        return len(client.generate([ids], params).outputs[0][0].token_ids)

    return one


def _openai(url: str, max_tokens: int) -> Callable[[int], int]:
    """One chat completion through an OpenAI client: its reply's tokens."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=600)

    def one(i: int) -> int:
        r = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            max_tokens=max_tokens,
            temperature=0,
        )
        if r.usage is None:
            raise RuntimeError("the endpoint's reply has no usage")
        return int(r.usage.completion_tokens)

    return one


def bench_endpoint(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig, VLLMEngineConfig
    from rl.gateway.backends import ClientBackend, ServiceBackend
    from rl.gateway.server import Gateway
    from rl.model import ModelConfig, checkpoint, load_tokenizer
    from rl.serving.client import GeneratorClient
    from rl.serving.inprocess import serving

    quick = args.quick
    max_tokens = args.max_tokens or (24 if quick else 64)
    reps = 1 if quick else 3
    per = {1: 4 if quick else 8, 16: 16 if quick else 48}
    model = ModelConfig(path=args.model, dtype="float32") if args.model else ModelConfig(dtype="float32")
    engine_cfg = HFEngineConfig(max_model_len=1024) if args.engine == "hf" else VLLMEngineConfig(max_model_len=1024)
    tok = load_tokenizer(checkpoint(model))
    engine = make_engine(engine_cfg, model)
    folder = Path(tempfile.mkdtemp(prefix="sarl-bench-endpoint-"))
    out: dict[str, Any] = {"engine": engine.backend, "max_tokens": max_tokens, "reps": reps, "requests": per}
    try:
        with serving(engine, folder) as server:
            native = GeneratorClient(folder, timeout_s=600)
            served = Gateway(ServiceBackend(server), tok, model="m", token="k", max_n=64).start()
            run_gw = Gateway(ClientBackend(GeneratorClient(folder, timeout_s=600), 1024, engine.vocab_size), tok,
                             model="m", token="k", max_n=64).start()  # fmt: skip
            ways = {
                "native": _native(native, tok, max_tokens),
                "openai_serve": _openai(served.url, max_tokens),
                "openai_run": _openai(run_gw.url, max_tokens),
            }
            for way in ways.values():  # warm-up: every path once
                way(0)
            for c in (1, 16):
                got: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
                for _ in range(reps):
                    for w, fn in ways.items():
                        got[w].append(_run(fn, c, per[c]))
                out[f"c{c}"] = {
                    w: {
                        "requests_per_s": round(statistics.median(r for r, _ in v), 3),
                        "tokens_per_s": round(statistics.median(t for _, t in v), 2),
                    }
                    for w, v in got.items()
                }
            served.stop()
            run_gw.stop()
    finally:
        engine.close()
    ratio = out["c16"]["openai_serve"]["tokens_per_s"] / out["c16"]["native"]["tokens_per_s"]
    ratio_run = out["c16"]["openai_run"]["tokens_per_s"] / out["c16"]["native"]["tokens_per_s"]
    out["ratio_c16"] = {"serve": round(ratio, 3), "run": round(ratio_run, 3)}
    return out, _endpoint_lines(out, Path(checkpoint(model)).name, met=min(ratio, ratio_run) >= 0.9)


def _endpoint_lines(out: dict[str, Any], model: str, met: bool) -> list[str]:
    per = out["requests"]
    lines = [
        f"endpoint: {model} on {out['engine']} (float32), greedy replies of up to {out['max_tokens']} "
        f"tokens; median of {out['reps']}"
    ]
    for c in (1, 16):
        row = out[f"c{c}"]
        base = row["native"]["tokens_per_s"]
        cells = [f"native {base:.1f} tok/s ({row['native']['requests_per_s']:.2f} req/s)"]
        for w, label in (("openai_serve", "openai, sarl serve"), ("openai_run", "openai, in a run")):
            r = row[w]
            cells.append(f"{label} {r['tokens_per_s']:.1f} tok/s ({r['tokens_per_s'] / base:.2f}x)")
        lines.append(f"concurrency {c:>2} ({per[c]} requests): " + " | ".join(cells))
    lines.append(
        "target: the endpoint >= 0.9x the native protocol's tokens/s at concurrency 16: "
        + ("met" if met else "NOT met")
    )
    return lines
