"""`sarl bench learner`: the learner's compute on SmolLM2-135M-Instruct (or
`--model`), each figure beside its baseline in the same run.

Each side runs in a process of its own, so that its peak memory is its
own: the resident set's high-water mark on CPU, `max_memory_allocated` on
a GPU. The data are HumanEval prompts with their reference solutions as
the sampled reply (real token sequences, the prompt masked), rewards
alternating within groups of 4. One step is a warm-up and is not timed.
Tokens are sequence tokens (prompt and reply) through forward and backward.

* `fp32_tok_s`, `bf16_tok_s`, `bf16_over_fp32`: the learner in float32 and
  with bf16 weights (float32 master weights; target >= 1.7 where the CPU
  has bf16); `autocast_over_fp32`: under bf16 autocast;
* `auto_precision`, `auto_over_fp32`: what `auto` picks here; on a CPU,
  `auto_no_bf16_over_fp32`: `auto` with this CPU's bf16 flags hidden
  (it must pick float32, and be no slower);
* `lora_over_full_step`: a LoRA (r16, all linear layers) step's time over a
  full step's, both under `auto` (target <= 0.8);
* `ratio`: the DeepSpeed learner over a plain PyTorch loop with the same
  model, data, loss, optimizer, micro-batches and precision (bf16
  autocast) (target >= 0.9);
* `lora_publish_load_s`, `full_publish_load_s`: a new version from the
  learner's state into a live generator engine (`--engine`): the learner's
  state_dict and publish, the engine's verified load (for LoRA, the merge
  into its resident base); medians over versions, each after a real step
  (target: LoRA <= 1 s);
* `*_peak_gb`; on a GPU, `learner_tflops` and `mfu` (6 x parameters x
  tokens per second over the device's dense bf16 peak, `PEAK_TFLOPS`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rl.layout import RunLayout

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}
"""Dense bf16 peak of a device, by a part of its name."""


def _samples(n: int, max_len: int, model: str) -> list[Any]:
    import numpy as np

    from rl.model import chat_ids, load_tokenizer
    from rl.store import Sample
    from rl.tasks.importers import import_humaneval

    tok = load_tokenizer(model)
    out = []
    for i, t in enumerate(import_humaneval()[:n]):
        prompt = chat_ids(tok, [{"role": "user", "content": t.prompt}])[: max_len // 2]
        reply = tok.encode(t.reference, add_special_tokens=False)[: max_len - len(prompt)]
        ids = np.array(prompt + reply, dtype=np.int32)
        mask = np.array([0] * len(prompt) + [1] * len(reply), dtype=np.uint8)
        logprobs = np.where(mask == 1, -1.0, 0.0).astype(np.float32)
        out.append(Sample(t.task_id, i // 4, 0, ids, mask, logprobs, reward=float(i % 2)))
    return out


def _role(samples: int, max_len: int, precision: str, lora: bool) -> Any:
    from rl.learner.config import LearnerRole

    raw: dict[str, Any] = {"samples_per_step": samples, "precision": precision, "steps": 100}
    if lora:
        raw["lora"] = {"rank": 16, "alpha": 32}
    return LearnerRole.model_validate(raw)


def _peak_gb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _side_learner(model: str, samples: list[Any], spec: dict[str, Any]) -> dict[str, Any]:
    from rl.learner.trainer import Trainer

    trainer = Trainer(model, _role(len(samples), spec["max_len"], spec["precision"], spec["lora"]))
    times = []
    for _ in range(spec["steps"] + 1):
        t0 = time.perf_counter()
        assert trainer.step(samples) is not None
        times.append(time.perf_counter() - t0)
    return {"step_s": times[1:], "precision": trainer.precision}


def _side_torch(model: str, samples: list[Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The same step as rl.learner.trainer without DeepSpeed: forward to
    log-probs (under the same precision), the same loss and off-policy
    weights, share-weighted accumulation, clipping, AdamW."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from rl.learner.correction import correct
    from rl.learner.data import micro_batches
    from rl.learner.losses import LossInputs
    from rl.precision import learner_precision

    lc = _role(len(samples), spec["max_len"], spec["precision"], False)
    precision = learner_precision(lc.precision)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    net.config.use_cache = False
    net.to(dev).train()  # type: ignore[arg-type]
    o = lc.optimizer
    opt = torch.optim.AdamW(net.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    groups = torch.tensor([s.group_id for s in samples])
    lengths = torch.tensor([int(np.asarray(s.loss_mask).sum()) for s in samples])
    adv = lc.loss.advantages(rewards, groups, lengths).float()
    index = {id(s): i for i, s in enumerate(samples)}
    times = []
    for _ in range(spec["steps"] + 1):
        t0 = time.perf_counter()
        for part in micro_batches(samples, lc.micro_batches, lc.micro_batch_tokens):
            n = max(len(s.tokens) for s in part)
            ids = torch.zeros(len(part), n, dtype=torch.long)
            attn = torch.zeros_like(ids)
            mask = torch.zeros(len(part), n)
            behaviour = torch.zeros(len(part), n)
            for i, s in enumerate(part):
                ids[i, : len(s.tokens)] = torch.from_numpy(np.asarray(s.tokens, dtype=np.int64))
                attn[i, : len(s.tokens)] = 1
                mask[i, : len(s.tokens)] = torch.from_numpy(np.asarray(s.loss_mask, dtype=np.float32))
                behaviour[i, : len(s.tokens)] = torch.from_numpy(np.asarray(s.logprobs, dtype=np.float32))
            ids, attn, mask, behaviour = ids.to(dev), attn.to(dev), mask.to(dev), behaviour.to(dev)
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=precision == "bf16-autocast"):
                logits = net(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            corr = correct(logp.detach(), behaviour[:, 1:], mask[:, 1:], lc.correction)
            a = adv[[index[id(s)] for s in part]].to(dev)
            x = LossInputs(logp, logp.detach(), behaviour[:, 1:], corr.mask, a, corr.weights)
            (lc.loss.compute(x).loss * (len(part) / len(samples))).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"step_s": times[1:], "precision": precision}


def _side_publish(model: str, samples: list[Any], spec: dict[str, Any]) -> dict[str, Any]:
    """What a new weight version costs from the learner's state to a live
    generator: the learner's `state_dict()` and `publish` (as
    rl.learner.training does it), then the engine's `load_version` (as a
    generator does it: every checksum, the worker's load, a LoRA version
    merged into the resident base). Full weights and LoRA adapters, each
    after a real training step, `spec["versions"]` times; the median."""
    import statistics
    import tempfile

    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig, VLLMEngineConfig
    from rl.learner.trainer import Trainer
    from rl.model import ModelConfig
    from rl.precision import engine_dtype
    from rl.store.weights import WeightStore

    engine_cfg = VLLMEngineConfig(max_model_len=1024) if spec["engine"] == "vllm" else HFEngineConfig()
    engine = make_engine(engine_cfg, ModelConfig(path=model, dtype="auto"))
    out: dict[str, Any] = {"engine": f"{spec['engine']} {engine_dtype('auto')}"}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = WeightStore(RunLayout(tmp).store_path)
            version = 0
            for kind in ("full", "lora"):
                trainer = Trainer(model, _role(len(samples), spec["max_len"], "auto", kind == "lora"))
                publish, load = [], []
                for _ in range(spec["versions"]):
                    assert trainer.step(samples) is not None  # a new version differs from the last
                    version += 1
                    t0 = time.perf_counter()
                    weights, adapter = trainer.state_dict(), trainer.adapter_record()
                    dtype = None if adapter else ("float32" if trainer.precision == "float32" else "bfloat16")
                    store.publish(weights, version=version, dtype=dtype, adapter=adapter)
                    t1 = time.perf_counter()
                    engine.load_version(str(store.folder.parent), version)
                    publish.append(t1 - t0)
                    load.append(time.perf_counter() - t1)
                out[f"{kind}_publish_s"] = round(statistics.median(publish), 3)
                out[f"{kind}_load_s"] = round(statistics.median(load), 3)
                out[f"{kind}_first_load_s"] = round(load[0], 3)
                out[f"{kind}_bytes"] = int(store.manifest(version)["blob_bytes"])
                del trainer
    finally:
        engine.close()
    return out


SIDES = {"learner": _side_learner, "torch": _side_torch, "publish": _side_publish}


def _child(spec: dict[str, Any]) -> None:
    from rl.model import ModelConfig, checkpoint

    model = spec["model"] or str(checkpoint(ModelConfig(dtype="float32")))
    samples = _samples(spec["samples"], spec["max_len"], model)
    got = SIDES[spec["side"]](model, samples, spec)
    tokens = sum(len(s.tokens) for s in samples)
    if "step_s" in got:
        got["tok_s"] = tokens * len(got["step_s"]) / sum(got["step_s"])
        got["mean_step_s"] = sum(got["step_s"]) / len(got["step_s"])
    got.update(peak_gb=_peak_gb(), tokens_per_step=tokens, params=_params(model))
    import torch

    if torch.cuda.is_available():
        got["device"] = torch.cuda.get_device_name()
    print("BENCH " + json.dumps(got), flush=True)


def _params(model: str) -> float:
    """Parameters a token's forward and backward multiply by (tied embeddings: counted once)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model)
    return float(
        c.num_hidden_layers
        * (
            4 * c.hidden_size * c.hidden_size * (1 + c.num_key_value_heads / c.num_attention_heads) / 2
            + 3 * c.hidden_size * c.intermediate_size
        )
        + c.vocab_size * c.hidden_size
    )


def _run_side(spec: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rl.bench.learner_step", json.dumps(spec)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"bench learner: the {spec['name']} side failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(line[6:])
    return result


def _without_bf16(folder: Path) -> str:
    """A copy of this CPU's description with its bf16 flags hidden (rl.precision)."""
    from rl.precision import BF16_CPU_FLAGS

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else "flags\t: \n"
    for flag in BF16_CPU_FLAGS:
        text = text.replace(f" {flag}", "")
    path = folder / "cpuinfo-without-bf16"
    path.write_text(text)
    return str(path)


def bench_learner(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """Each figure beside its baseline, every side in a process of its own:
    float32 against bf16 autocast, what `auto` picks here and on this CPU
    with its bf16 flags hidden, a LoRA step against a full one, DeepSpeed
    against a plain PyTorch loop, and a LoRA version's publish and load
    against a full one's."""
    import tempfile

    import torch
    from tqdm import tqdm

    from rl.precision import describe

    n, max_len, steps, versions = (2, 96, 1, 2) if args.quick else (8, 256, 4, 3)
    base = {"model": args.model, "samples": n, "max_len": max_len, "steps": steps, "lora": False}
    sides: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        ("fp32", {"side": "learner", "precision": "float32"}, {}),
        ("bf16", {"side": "learner", "precision": "bf16"}, {}),
        ("autocast", {"side": "learner", "precision": "bf16-autocast"}, {}),
        ("auto", {"side": "learner", "precision": "auto"}, {}),
        ("lora", {"side": "learner", "precision": "auto", "lora": True}, {}),
        ("torch", {"side": "torch", "precision": "bf16-autocast"}, {}),
        ("publish", {"side": "publish", "engine": args.engine, "versions": versions}, {}),
    ]
    tmp = Path(tempfile.mkdtemp(prefix="sarl-bench-learner-"))
    if not torch.cuda.is_available():  # what `auto` does on a CPU without bf16: this one, its flags hidden
        sides.insert(
            3, ("auto_no_bf16", {"side": "learner", "precision": "auto"}, {"SARL_CPUINFO": _without_bf16(tmp)})
        )
    r: dict[str, Any] = {"samples_per_step": n, "max_len": max_len, "timed_steps": steps, "machine": describe()}
    bar = tqdm(total=len(sides), desc="bench learner", file=sys.stderr)
    got: dict[str, dict[str, Any]] = {}
    for name, spec, env in sides:
        got[name] = _run_side({**base, **spec, "name": name}, env)
        bar.update()
    bar.close()
    _figures(r, got)
    model = "SmolLM2-135M-Instruct" if args.model is None else args.model
    return r, _learner_lines(
        r, f"learner: {model}, {n} samples of up to {max_len} tokens per step, {steps} timed steps"
    )


def _figures(r: dict[str, Any], got: dict[str, dict[str, Any]]) -> None:
    """Each side's figures into `r`, and each beside its baseline."""
    for name, g in got.items():
        if "tok_s" in g:
            r[f"{name}_tok_s"] = round(g["tok_s"], 1)
            r[f"{name}_step_s"] = round(g["mean_step_s"], 3)
            r[f"{name}_peak_gb"] = round(g["peak_gb"], 3)
            r[f"{name}_precision"] = g["precision"]
    r["tokens_per_step"], r["params"] = got["fp32"]["tokens_per_step"], got["fp32"]["params"]
    r["bf16_over_fp32"] = round(r["bf16_tok_s"] / r["fp32_tok_s"], 3)
    r["autocast_over_fp32"] = round(r["autocast_tok_s"] / r["fp32_tok_s"], 3)
    r["auto_over_fp32"] = round(r["auto_tok_s"] / r["fp32_tok_s"], 3)
    if "auto_no_bf16" in got:
        r["auto_no_bf16_over_fp32"] = round(r["auto_no_bf16_tok_s"] / r["fp32_tok_s"], 3)
    r["lora_over_full_step"] = round(r["lora_step_s"] / r["auto_step_s"], 3)
    r["ratio"] = round(r["autocast_tok_s"] / r["torch_tok_s"], 3)  # DeepSpeed's learner / a plain loop, same precision
    pub = got["publish"]
    for k in ("full_publish_s", "full_load_s", "lora_publish_s", "lora_load_s", "full_first_load_s"):
        r[k] = pub[k]
    r["lora_first_load_s"], r["full_bytes"], r["lora_bytes"] = (
        pub["lora_first_load_s"],
        pub["full_bytes"],
        pub["lora_bytes"],
    )
    r["lora_publish_load_s"] = round(pub["lora_publish_s"] + pub["lora_load_s"], 3)
    r["full_publish_load_s"] = round(pub["full_publish_s"] + pub["full_load_s"], 3)
    r["publish_engine"] = pub["engine"]
    if "device" in got["auto"]:
        r["device"] = got["auto"]["device"]
        r["learner_tflops"] = round(6 * r["params"] * r["auto_tok_s"] / 1e12, 2)
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in r["device"]), None)
        if peak is not None:
            r["mfu"] = round(r["learner_tflops"] / peak, 4)


def _learner_lines(r: dict[str, Any], head: str) -> list[str]:
    lines = [
        f"{head}; {r['machine']}",
        f"  float32             {r['fp32_tok_s']:8.1f} tokens/s   peak {r['fp32_peak_gb']:.2f} GB",
        f"  bf16 weights        {r['bf16_tok_s']:8.1f} tokens/s   peak {r['bf16_peak_gb']:.2f} GB"
        f"   bf16 / fp32 {r['bf16_over_fp32']} (target >= 1.7 where the CPU has bf16)",
        f"  bf16 autocast       {r['autocast_tok_s']:8.1f} tokens/s   peak {r['autocast_peak_gb']:.2f} GB"
        f"   autocast / fp32 {r['autocast_over_fp32']}",
        f"  auto ({r['auto_precision']})  {r['auto_tok_s']:8.1f} tokens/s   auto / fp32 {r['auto_over_fp32']}",
    ]
    if "auto_no_bf16_tok_s" in r:
        lines.append(
            f"  auto, bf16 flags hidden ({r['auto_no_bf16_precision']})  {r['auto_no_bf16_tok_s']:.1f} tokens/s"
            f"   / fp32 {r['auto_no_bf16_over_fp32']} (target: not slower)"
        )
    lines += [
        f"  LoRA r16, auto      {r['lora_step_s']:8.2f} s a step against {r['auto_step_s']:.2f} s full"
        f"   LoRA / full {r['lora_over_full_step']} (target <= 0.8)   peak {r['lora_peak_gb']:.2f} GB",
        f"  plain PyTorch loop  {r['torch_tok_s']:8.1f} tokens/s (bf16 autocast)   DeepSpeed learner / loop"
        f" {r['ratio']} (target >= 0.9)",
        f"  publish + load into a live {r['publish_engine']} engine: LoRA {r['lora_publish_load_s']:.2f} s "
        f"({r['lora_publish_s']:.2f} + {r['lora_load_s']:.2f}; {r['lora_bytes'] / 1e6:.1f} MB; first load "
        f"{r['lora_first_load_s']:.2f} s)",
        f"      against full weights {r['full_publish_load_s']:.2f} s ({r['full_publish_s']:.2f} + "
        f"{r['full_load_s']:.2f}; {r['full_bytes'] / 1e6:.1f} MB)   (target: LoRA <= 1 s)",
    ]
    if "device" in r:
        lines.append(
            f"  {r['device']}: {r['learner_tflops']} TFLOP/s" + (f", MFU {r['mfu']:.1%}" if "mfu" in r else "")
        )
    return lines


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
