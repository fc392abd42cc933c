"""`sarl bench learner`: training tokens per second of the learner's
DeepSpeed step (rl.learner.trainer) on SmolLM2-135M-Instruct, beside a
plain PyTorch loop with the same model, data, loss, optimizer, dtype and
micro-batches, in the same run; and the peak memory of each.

Each side runs in a process of its own, so that its peak memory is its
own: the resident set's high-water mark on CPU, `max_memory_allocated` on
a GPU. The data are HumanEval prompts with their reference solutions as
the sampled reply (real token sequences, the prompt masked), rewards
alternating within groups of 4. One step is a warm-up and is not timed.

* `learner_tok_s`, `torch_tok_s`: sequence tokens (prompt and reply)
  through forward and backward per second of timed steps;
* `ratio` = learner / torch (target >= 0.9);
* `learner_peak_gb`, `torch_peak_gb`;
* on a GPU, `learner_tflops` and `mfu` (6 x parameters x tokens per second
  over the device's dense bf16 peak, where the device is in `PEAK_TFLOPS`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}
"""Dense bf16 peak of a device, by a part of its name."""


def _samples(n: int, max_len: int) -> list[Any]:
    import numpy as np

    from rl.model import ModelConfig, chat_ids, checkpoint, load_tokenizer
    from rl.store import Sample
    from rl.tasks.importers import import_humaneval

    tok = load_tokenizer(checkpoint(ModelConfig(dtype="float32")))
    out = []
    for i, t in enumerate(import_humaneval()[:n]):
        prompt = chat_ids(tok, [{"role": "user", "content": t.prompt}])[: max_len // 2]
        reply = tok.encode(t.reference, add_special_tokens=False)[: max_len - len(prompt)]
        ids = np.array(prompt + reply, dtype=np.int32)
        mask = np.array([0] * len(prompt) + [1] * len(reply), dtype=np.uint8)
        logprobs = np.where(mask == 1, -1.0, 0.0).astype(np.float32)
        out.append(Sample(t.task_id, i // 4, 0, ids, mask, logprobs, reward=float(i % 2)))
    return out


def _role(samples: int, micro: int, dtype: str) -> Any:
    from rl.learner.config import LearnerRole

    return LearnerRole.model_validate(
        {"samples_per_step": samples, "micro_batches": micro, "bf16": dtype == "bfloat16", "steps": 100}
    )


def _peak_gb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _side_learner(samples: list[Any], micro: int, steps: int, dtype: str) -> list[float]:
    from rl.learner.trainer import Trainer
    from rl.model import ModelConfig, checkpoint

    trainer = Trainer(str(checkpoint(ModelConfig(dtype="float32"))), _role(len(samples), micro, dtype))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        assert trainer.step(samples) is not None
        times.append(time.perf_counter() - t0)
    return times[1:]


def _side_torch(samples: list[Any], micro: int, steps: int, dtype: str) -> list[float]:
    """The same step as rl.learner.trainer without DeepSpeed: forward to
    log-probs, the same loss and off-policy weights, share-weighted
    accumulation, clipping, AdamW."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from rl.learner.correction import correct
    from rl.learner.data import micro_batches
    from rl.learner.losses import LossInputs
    from rl.model import ModelConfig, checkpoint

    lc = _role(len(samples), micro, dtype)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint(ModelConfig(dtype="float32"))), dtype=torch.float32)
    model.config.use_cache = False
    model.to(dev).train()  # type: ignore[arg-type]
    o = lc.optimizer
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    groups = torch.tensor([s.group_id for s in samples])
    lengths = torch.tensor([int(np.asarray(s.loss_mask).sum()) for s in samples])
    adv = lc.loss.advantages(rewards, groups, lengths).float()
    index = {id(s): i for i, s in enumerate(samples)}
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        for part in micro_batches(samples, micro):
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
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):  # fp32 master weights
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            corr = correct(logp.detach(), behaviour[:, 1:], mask[:, 1:], lc.correction)
            a = adv[[index[id(s)] for s in part]].to(dev)
            x = LossInputs(logp, logp.detach(), behaviour[:, 1:], corr.mask, a, corr.weights)
            (lc.loss.compute(x).loss * (len(part) / len(samples))).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times[1:]


def _child(side: str, n: int, max_len: int, micro: int, steps: int, dtype: str) -> None:
    samples = _samples(n, max_len)
    fn = _side_learner if side == "learner" else _side_torch
    times = fn(samples, micro, steps, dtype)
    tokens = sum(len(s.tokens) for s in samples)
    out: dict[str, Any] = {"tok_s": tokens * len(times) / sum(times), "peak_gb": _peak_gb(), "tokens_per_step": tokens}
    import torch
    from transformers import AutoConfig

    from rl.model import ModelConfig, checkpoint

    c = AutoConfig.from_pretrained(str(checkpoint(ModelConfig(dtype="float32"))))
    # parameters a token's forward and backward multiply by (tied embeddings: counted once)
    out["params"] = (
        c.num_hidden_layers
        * (
            4 * c.hidden_size * c.hidden_size * (1 + c.num_key_value_heads / c.num_attention_heads) / 2
            + 3 * c.hidden_size * c.intermediate_size
        )
        + c.vocab_size * c.hidden_size
    )

    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name()
    print("BENCH " + json.dumps(out), flush=True)


def _run_side(side: str, n: int, max_len: int, micro: int, steps: int, dtype: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rl.bench.learner_step", side, str(n), str(max_len), str(micro), str(steps), dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"bench learner: the {side} side failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(line[6:])
    return result


def bench_learner(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    from tqdm import tqdm

    n, max_len, micro, steps = (2, 96, 1, 1) if args.quick else (8, 256, 2, 4)
    dtype = args.dtype
    r: dict[str, Any] = {"samples_per_step": n, "max_len": max_len, "micro_batches": micro, "timed_steps": steps}
    r["dtype"] = dtype
    bar = tqdm(total=2, desc="bench learner", file=sys.stderr)
    for side in ("learner", "torch"):
        got = _run_side(side, n, max_len, micro, steps, dtype)
        r[f"{side}_tok_s"] = round(got["tok_s"], 1)
        r[f"{side}_peak_gb"] = round(got["peak_gb"], 3)
        r["tokens_per_step"], r["params"] = got["tokens_per_step"], got["params"]
        if "device" in got:
            r["device"] = got["device"]
        bar.update()
    bar.close()
    r["ratio"] = round(r["learner_tok_s"] / r["torch_tok_s"], 3)
    lines = [
        f"learner: SmolLM2-135M-Instruct, {n} samples of up to {max_len} tokens per step in {micro} micro-batches, "
        f"{dtype}, {steps} timed steps",
        f"  DeepSpeed learner   {r['learner_tok_s']:.1f} tokens/s   peak {r['learner_peak_gb']:.2f} GB",
        f"  plain PyTorch loop  {r['torch_tok_s']:.1f} tokens/s   peak {r['torch_peak_gb']:.2f} GB",
        f"  ratio {r['ratio']} (target >= 0.9)",
    ]
    if "device" in r:
        r["learner_tflops"] = round(6 * r["params"] * r["learner_tok_s"] / 1e12, 2)
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in r["device"]), None)
        if peak is not None:
            r["mfu"] = round(r["learner_tflops"] / peak, 4)
        lines.append(f"  {r['device']}: {r['learner_tflops']} TFLOP/s" + (f", MFU {r['mfu']:.1%}" if peak else ""))
    return r, lines


if __name__ == "__main__":
    side, n, max_len, micro, steps, dtype = sys.argv[1:7]
    _child(side, int(n), int(max_len), int(micro), int(steps), dtype)
