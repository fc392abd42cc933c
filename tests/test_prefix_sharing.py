"""A group's shared prompt is computed once by the learner: which tokens may
be shared, micro-batches of whole groups under the token budget, and
log-probs, gradients and a whole learner step equal (within float
rounding) to those of one pass a reply, while the prompt is embedded once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rl.learner.data import MIN_SHARED_PREFIX, micro_batches, shared_prefix
from rl.store import Sample


def _sample(prompt: list[int], reply: list[int], group: int, i: int = 0) -> Sample:
    ids = np.array(prompt + reply, dtype=np.int32)
    mask = np.array([0] * len(prompt) + [1] * len(reply), dtype=np.uint8)
    logprobs = np.where(mask == 1, -1.5, 0.0).astype(np.float32)
    return Sample(f"t{group}", group, 0, ids, mask, logprobs, reward=float(i % 2), episode_id=f"{group}/{i}")


def _groups(groups: int, size: int, prompt_len: int, seed: int = 0, vocab: int = 40000) -> list[Sample]:
    """`groups` groups of `size` replies of different lengths and tokens, one prompt a group."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        prompt = rng.integers(5, vocab, prompt_len).tolist()
        for i in range(size):
            out.append(_sample(prompt, rng.integers(5, vocab, int(rng.integers(6, 40))).tolist(), g, i))
    return out


def test_the_shared_prefix_stops_at_the_first_difference_and_before_the_first_trained_token() -> None:
    p = list(range(100, 160))
    same = [_sample(p, [7, 8, 9], 0), _sample(p, [7, 3], 0, 1)]
    # the replies' common first token is trained: its logits sit at the prompt's last position
    assert shared_prefix(same) == len(p) - 1
    differ = [_sample(p, [7], 0), _sample(p[:20] + [1] + p[21:], [7], 0, 1)]
    assert shared_prefix(differ) == 20
    early = _sample(p, [7], 0, 1)
    early.loss_mask[10] = 1  # a trained token inside the prompt
    assert shared_prefix([same[0], early]) == 9
    assert shared_prefix(same[:1]) == 0  # nothing to share alone


def test_under_the_budget_each_group_with_a_long_prompt_is_its_own_micro_batch() -> None:
    shared = _groups(3, 8, prompt_len=80)
    short = _groups(2, 4, prompt_len=MIN_SHARED_PREFIX - 10, seed=1)
    for s in short:
        s.group_id += 10
    samples = shared + short
    budget = 300
    parts = micro_batches(samples, token_budget=budget, share_prefixes=True)
    assert sorted(id(s) for part in parts for s in part) == sorted(id(s) for s in samples)  # each once
    family = [p for p in parts if {s.group_id for s in p} <= {0, 1, 2}]
    assert family and all(len({s.group_id for s in p}) == 1 for p in family)  # one group each
    assert len(family) > 3  # 8 replies after a prompt of 80 are over 300 tokens: cut
    for part in family:
        p, longest = shared_prefix(part), max(len(s.tokens) for s in part)
        assert p >= 79 and (len(part) == 1 or p + len(part) * (longest - p) <= budget)
    rest = [p for p in parts if p not in family]
    assert {s.group_id for p in rest for s in p} == {10, 11}  # short prompts: packed as before
    assert all(max(len(s.tokens) for s in p) * len(p) <= budget for p in rest)
    plain = micro_batches(samples, token_budget=budget)
    assert any(len({s.group_id for s in p}) > 1 for p in plain)  # without sharing, groups mix


def _logprob_grads(model: Any, samples: list[Sample], prefix: int) -> tuple[Any, Any, int]:
    """Log-probs, the gradient of their sum, and the tokens the embedding saw."""
    import torch

    from rl.learner.logprobs import token_logprobs

    n = max(len(s.tokens) for s in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.long)
    attn, mask = torch.zeros_like(ids), torch.zeros(len(samples), n)
    for i, s in enumerate(samples):
        ids[i, : len(s.tokens)] = torch.from_numpy(s.tokens.astype(np.int64))
        attn[i, : len(s.tokens)] = 1
        mask[i, : len(s.tokens)] = torch.from_numpy(s.loss_mask.astype(np.float32))
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].numel()))
    model.zero_grad()
    logp, _, _ = token_logprobs(model, ids, attn, mask, torch.full((len(samples),), 0.8), prefix)
    logp.sum().backward()
    hook.remove()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logp.detach(), grads, sum(seen)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_shared_prefix_gives_the_log_probs_and_gradients_of_one_pass_a_reply(model_cache: Path, lora: bool) -> None:
    """On SmolLM2-135M (float32), a group of 6 replies of different lengths."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl.learner.config import LoraSection
    from rl.learner.trainer import with_lora
    from rl.model import ModelConfig, checkpoint

    net = AutoModelForCausalLM.from_pretrained(checkpoint(ModelConfig(dtype="float32", cache_dir=model_cache)))
    if lora:  # B starts at zero: move it, so that the adapters change the prompt's keys and values
        net = with_lora(net, LoraSection(rank=4, alpha=8), seed=1)
        with torch.no_grad():
            for name, p in net.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
    samples = _groups(1, 6, prompt_len=70, seed=2)
    p = shared_prefix(samples)
    assert p == 69
    whole, g_whole, seen_whole = _logprob_grads(net, samples, 0)
    shared, g_shared, seen_shared = _logprob_grads(net, samples, p)
    trained = whole != 0
    assert trained.sum() > 100 and torch.equal(trained, shared != 0)
    assert torch.allclose(shared, whole, atol=2e-4, rtol=0), float((shared - whole).abs().max())
    # float32 sums in another order: the difference is tiny beside the gradient (a prompt
    # whose keys and values were cut from the graph is off by a fifth of it or more)
    off = float((g_shared - g_whole).norm() / g_whole.norm())
    assert off < 1e-4, off
    longest = max(len(s.tokens) for s in samples)
    assert seen_whole == 6 * longest and seen_shared == p + 6 * (longest - p)  # the prompt once


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_learner_step_with_shared_prefixes_moves_the_weights_as_one_without(tiny_model: Path, lora: bool) -> None:
    import torch

    from rl.learner.config import LearnerRole
    from rl.learner.trainer import Trainer

    samples = _groups(3, 4, prompt_len=60, seed=3, vocab=1000)
    raw: dict[str, Any] = {"samples_per_step": len(samples), "precision": "float32", "optimizer": {"lr": 1e-3}}
    if lora:
        raw["lora"] = {"rank": 4, "alpha": 8}
    weights, figures = [], []
    embedded: dict[bool, list[int]] = {False: [], True: []}
    for share in (False, True):
        trainer = Trainer(str(tiny_model), LearnerRole.model_validate({**raw, "share_prefixes": share}), seed=1)
        trainer.engine.module.get_input_embeddings().register_forward_hook(
            lambda m, i, o, seen=embedded[share]: seen.append(i[0].numel())
        )
        start = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters() if p.requires_grad}
        for _ in range(2):
            figures.append(trainer.step(samples))
        assert any(not torch.equal(p, start[n]) for n, p in trainer.engine.module.named_parameters() if n in start)
        weights.append({n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()})
    assert sum(embedded[True]) < 0.6 * sum(embedded[False])  # each group's prompt once
    for name, w in weights[0].items():
        assert torch.allclose(weights[1][name], w, atol=1e-5, rtol=1e-4), name
    for plain, shared in ((figures[0], figures[2]), (figures[1], figures[3])):
        assert plain is not None and shared is not None
        for key in ("loss", "entropy", "mismatch_kl", "grad_norm"):
            assert shared[key] == pytest.approx(plain[key], rel=1e-3, abs=1e-5), key
