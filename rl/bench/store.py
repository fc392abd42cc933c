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
    from safetensors.torch import load_file, save_file
    from tqdm import tqdm

    from rl.store import Sample, Store

    reps = 3 if args.quick else 7
    batches = 10 if args.quick else 40
    work = Path(tempfile.mkdtemp(prefix="sarl-bench-store-", dir=args.dir))
    bar = tqdm(total=(reps + 1) * 5 + reps * 2 + 1, desc="bench store", file=sys.stderr)
    try:
        gen = torch.Generator().manual_seed(0)
        sd = {k: torch.randn(*s, generator=gen) for k, s in smollm2_shapes().items()}
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        model = {k: t.clone() for k, t in sd.items()}  # a generator's live weights, memory touched
        ws = Store(work / "store").weights
        t: dict[str, list[float]] = {
            k: [] for k in ("publish", "save", "load", "load_unverified", "st_load", "full", "delta", "delta_detect")
        }
        version = 0
        for r in range(reps + 1):  # round 0 warms the allocator and page cache up; it is not counted
            st_path = work / f"model-{r}.safetensors"

            def load_st(p: Path = st_path) -> None:
                for k, x in load_file(str(p)).items():
                    model[k].copy_(x)

            steps: list[tuple[str, Callable[[], Any]]] = [
                ("publish", partial(ws.publish, sd, version=version, dtype=None, full_every=1)),
                ("save", partial(save_file, sd, str(st_path))),
                ("load", partial(ws.load_into, model, version)),
                ("load_unverified", partial(ws.load_into, model, version, verify=False)),
                ("st_load", load_st),
            ]
            pairs = [steps[:2], steps[2:]]
            for pair in pairs:
                for name, fn in pair if r % 2 == 0 else pair[::-1]:
                    dt = _timed(fn)
                    if r:
                        t[name].append(dt)
                    bar.update()
            version += 1
            st_path.unlink()
            ws.retain(keep_last=1)

        # delta vs full, for the same 1% change
        names = [k for k in sd if "layers" in k]
        changed = names[:: max(1, len(names) // max(1, round(len(sd) * 0.01)))][: max(1, round(len(sd) * 0.01))]
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

        rollout = _bench_rollouts(work, batches, Sample, Store)
        bar.update(4)
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in t.items()}
    gb = nbytes / 1e9
    result = {
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
    lines: list[str] = []
    lines.append(f"weights: {result['params'] / 1e6:.1f}M params, {gb:.2f} GB fp32, median of {reps}")
    lines.append(
        f"  publish  sarl {result['sarl_publish_gbps']:.2f} GB/s   safetensors save "
        f"{result['safetensors_save_gbps']:.2f} GB/s   ratio {result['publish_ratio']} (target >= 0.8)"
    )
    lines.append(
        f"  load     sarl {result['sarl_load_gbps']:.2f} GB/s   safetensors load "
        f"{result['safetensors_load_gbps']:.2f} GB/s   ratio {result['load_ratio']} (target >= 0.8)"
    )
    lines.append(
        f"           without checksums {result['sarl_load_unverified_gbps']:.2f} GB/s   "
        f"ratio {result['load_unverified_ratio']}"
    )
    lines.append(
        f"  delta    {len(changed)} of {len(sd)} tensors changed: {result['delta_publish_s']:.3f} s vs full "
        f"{result['full_publish_s']:.3f} s   speedup {result['delta_speedup']} (target >= 10)"
    )
    lines.append(
        f"           found by checksum instead of named: {result['delta_detect_publish_s']:.3f} s, speedup "
        f"{result['delta_detect_speedup']}"
    )
    lines.append(
        f"rollouts: batches of 512 samples x {rollout['tokens_per_sample']} tokens, {rollout['batches']} batches"
    )
    lines.append(
        f"  write    sarl {rollout['rollout_write_rps']:,.0f} rec/s   zarr API {rollout['zarr_api_write_rps']:,.0f}"
        f" rec/s   (target >= 50,000)"
    )
    lines.append(
        f"  read     sarl {rollout['rollout_read_rps']:,.0f} rec/s   zarr API {rollout['zarr_api_read_rps']:,.0f}"
        f" rec/s   (target >= 200,000)"
    )
    return result, lines


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
