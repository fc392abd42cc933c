"""`sarl bench store`: the store beside its baselines, same run, same disk.

* weights: a 134.5M-parameter state dict with SmolLM2-135M's exact tensor
  names and shapes (seeded random values, fp32: 538 MB), published and
  loaded by the store vs saved and loaded by safetensors. "Load" ends with the
  tensors copied into a preallocated model state for both, as a generator
  does; the store also verifies every checksum on the way.
* delta: a version where 1% of the tensors changed, published as a delta
  (changes found by checksum) vs the same version published in full.
* rollouts: batches of 512 samples written and read back (checksums
  verified) by the store, vs the same columns through zarr's public API.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np


def smollm2_shapes() -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of SmolLM2-135M (tied embeddings)."""
    hidden, inter, layers, vocab, kv = 576, 1536, 30, 49152, 192
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _timed_result(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_store(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The figures, and the lines that show them beside their baselines."""
    import torch
    from tqdm import tqdm

    from rl.store import Sample, Store

    reps = 3 if args.quick else 7
    batches = 10 if args.quick else 40
    work = Path(tempfile.mkdtemp(prefix="sarl-bench-store-", dir=args.dir))
    bar = tqdm(total=(reps + 1) * 5 + reps * 2 + 1, desc="bench store", file=sys.stderr)
    try:
        gen = torch.Generator().manual_seed(0)
        sd = {k: torch.randn(*s, generator=gen) for k, s in smollm2_shapes().items()}
        ws = Store(work / "store").weights
        t = _publish_and_load(ws, sd, work, reps, bar)
        changed = _delta_vs_full(ws, sd, reps, bar, t, version=reps + 1)
        rollout = _bench_rollouts(work, batches, Sample, Store)
        bar.update(4)
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)
    result = _figures(t, sd, reps, changed, rollout)
    return result, _store_lines(result)


def _publish_and_load(ws: Any, sd: dict[str, Any], work: Path, reps: int, bar: Any) -> dict[str, list[float]]:
    """Each round publishes a version and saves the same weights with
    safetensors, then loads each into live weights; the order of each pair
    alternates between rounds. Returns the seconds of each, round 0 (the
    allocator's and the page cache's warm-up) left out."""
    from safetensors.torch import load_file, save_file

    model = {k: x.clone() for k, x in sd.items()}  # a generator's live weights, memory touched
    t: dict[str, list[float]] = {k: [] for k in ("publish", "save", "load", "load_unverified", "st_load")}
    for r in range(reps + 1):
        st_path = work / f"model-{r}.safetensors"

        def load_st(p: Path = st_path) -> None:
            for k, x in load_file(str(p)).items():
                model[k].copy_(x)

        steps: list[tuple[str, Callable[[], Any]]] = [
            ("publish", partial(ws.publish, sd, version=r, dtype=None, full_every=1)),
            ("save", partial(save_file, sd, str(st_path))),
            ("load", partial(ws.load_into, model, r)),
            ("load_unverified", partial(ws.load_into, model, r, verify=False)),
            ("st_load", load_st),
        ]
        for pair in (steps[:2], steps[2:]):
            for name, fn in pair if r % 2 == 0 else pair[::-1]:
                dt = _timed(fn)
                if r:
                    t[name].append(dt)
                bar.update()
        st_path.unlink()
        ws.retain(keep_last=1)
    return t


def _delta_vs_full(
    ws: Any, sd: dict[str, Any], reps: int, bar: Any, t: dict[str, list[float]], version: int
) -> list[str]:
    """The same 1% change published whole, as a delta of the tensors named
    changed, and as a delta found by checksum; the seconds of each go to `t`.
    Returns the changed tensors' names."""
    import torch

    names = [k for k in sd if "layers" in k]
    changed = names[:: max(1, len(names) // max(1, round(len(sd) * 0.01)))][: max(1, round(len(sd) * 0.01))]
    for key in ("full", "delta", "delta_detect"):
        t[key] = []
    for _ in range(reps):
        for k in changed:
            sd[k].add_(1.0)
        t["full"].append(_timed(partial(ws.publish, sd, version=version, dtype=None, full_every=1)))
        version += 1
        bar.update()
        for k in changed:  # the learner names what it trains
            sd[k].add_(1.0)
        dt, named = _timed_result(
            partial(ws.publish, sd, version=version, dtype=None, full_every=1000, changed=changed)
        )
        t["delta"].append(dt)
        version += 1
        for k in changed:  # or the publisher finds it by checksum
            sd[k].add_(1.0)
        dt, found = _timed_result(partial(ws.publish, sd, version=version, dtype=None, full_every=1000))
        t["delta_detect"].append(dt)
        version += 1
        for p in (named, found):
            assert p.kind == "delta" and p.written_tensors == len(changed), p
        bar.update(2)
        ws.retain(keep_last=1)
    _, check = ws.load()
    assert all(torch.equal(check[k], sd[k]) for k in sd), "delta versions do not load to the published weights"
    return changed


def _figures(
    t: dict[str, list[float]], sd: dict[str, Any], reps: int, changed: list[str], rollout: dict[str, Any]
) -> dict[str, Any]:
    """Medians as rates, each beside its baseline."""
    nbytes = sum(x.numel() * x.element_size() for x in sd.values())
    med = {k: statistics.median(v) for k, v in t.items()}
    gb = nbytes / 1e9
    return {
        "params": sum(x.numel() for x in sd.values()),
        "bytes": nbytes,
        "repetitions": reps,
        "sarl_publish_gbps": round(gb / med["publish"], 3),
        "safetensors_save_gbps": round(gb / med["save"], 3),
        "publish_ratio": round(med["save"] / med["publish"], 2),
        "sarl_load_gbps": round(gb / med["load"], 3),
        "safetensors_load_gbps": round(gb / med["st_load"], 3),
        "load_ratio": round(med["st_load"] / med["load"], 2),
        "sarl_load_unverified_gbps": round(gb / med["load_unverified"], 3),
        "load_unverified_ratio": round(med["st_load"] / med["load_unverified"], 2),
        "changed_tensors": len(changed),
        "tensors": len(sd),
        "full_publish_s": round(med["full"], 4),
        "delta_publish_s": round(med["delta"], 4),
        "delta_speedup": round(med["full"] / med["delta"], 1),
        "delta_detect_publish_s": round(med["delta_detect"], 4),
        "delta_detect_speedup": round(med["full"] / med["delta_detect"], 1),
        **rollout,
    }


def _store_lines(result: dict[str, Any]) -> list[str]:
    r = result
    return [
        f"weights: {r['params'] / 1e6:.1f}M params, {r['bytes'] / 1e9:.2f} GB fp32, median of {r['repetitions']}",
        f"  publish  sarl {r['sarl_publish_gbps']:.2f} GB/s   safetensors save "
        f"{r['safetensors_save_gbps']:.2f} GB/s   ratio {r['publish_ratio']} (target >= 0.8)",
        f"  load     sarl {r['sarl_load_gbps']:.2f} GB/s   safetensors load "
        f"{r['safetensors_load_gbps']:.2f} GB/s   ratio {r['load_ratio']} (target >= 0.8)",
        f"           without checksums {r['sarl_load_unverified_gbps']:.2f} GB/s   ratio {r['load_unverified_ratio']}",
        f"  delta    {r['changed_tensors']} of {r['tensors']} tensors changed: {r['delta_publish_s']:.3f} s vs full "
        f"{r['full_publish_s']:.3f} s   speedup {r['delta_speedup']} (target >= 10)",
        f"           found by checksum instead of named: {r['delta_detect_publish_s']:.3f} s, speedup "
        f"{r['delta_detect_speedup']}",
        f"rollouts: batches of 512 samples x {r['tokens_per_sample']} tokens, {r['batches']} batches",
        f"  write    sarl {r['rollout_write_rps']:,.0f} rec/s   zarr API {r['zarr_api_write_rps']:,.0f}"
        " rec/s   (target >= 50,000)",
        f"  read     sarl {r['rollout_read_rps']:,.0f} rec/s   zarr API {r['zarr_api_read_rps']:,.0f}"
        " rec/s   (target >= 200,000)",
    ]


def _bench_rollouts(work: Path, batches: int, sample_cls: Any, store_cls: Any) -> dict[str, Any]:
    import zarr

    n, tokens = 512, 256
    rng = np.random.default_rng(0)
    data = []
    for b in range(batches):
        data.append(
            [
                sample_cls(
                    task_id=f"task-{b}-{i}",
                    group_id=b * n + i // 8,
                    policy_version=b,
                    tokens=rng.integers(0, 49152, tokens, dtype=np.int32),
                    loss_mask=(np.arange(tokens) > 64).astype(np.uint8),
                    logprobs=rng.standard_normal(tokens).astype(np.float32),
                    reward=float(i % 2),
                    checks={"tests": float(i % 2), "lint": 1.0},
                    timings={"generate_s": 1.0},
                )
                for i in range(n)
            ]
        )
    store = store_cls(work / "rollouts-store")
    w = store.writer("bench")
    t_write = _timed(lambda: [w.write(seq, batch) for seq, batch in enumerate(data)])
    reader = store.reader()
    keys = reader.committed()
    t_read = _timed(lambda: [len(reader.read(k)) for k in keys])

    from rl.store.rollouts import _columns

    cols = [_columns(batch)[0] for batch in data]

    def zarr_write() -> None:
        for seq, c in enumerate(cols):
            g = zarr.open_group(str(work / "zarr-api" / f"{seq:010d}"), mode="w")
            for name, a in c.items():
                g.create_array(name, data=a, compressors=None)

    def zarr_read() -> None:
        for seq in range(len(cols)):
            g = zarr.open_group(str(work / "zarr-api" / f"{seq:010d}"), mode="r")
            for name in cols[0]:
                g[name][...]  # type: ignore[index]

    t_zw = _timed(zarr_write)
    t_zr = _timed(zarr_read)
    total = batches * n
    return {
        "batches": batches,
        "tokens_per_sample": tokens,
        "rollout_write_rps": round(total / t_write),
        "rollout_read_rps": round(total / t_read),
        "zarr_api_write_rps": round(total / t_zw),
        "zarr_api_read_rps": round(total / t_zr),
    }
