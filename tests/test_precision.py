"""bf16 where it pays: `auto` reads the machine (a CPU flag hidden makes it
float32), and the bf16 paths compute log-probs close to float32's, within
the tolerances stated here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rl import precision

CPU_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA device decides `auto` there (tests/test_gpu.py)"
)

MEAN_ABS_NATS = 0.06
"""Largest mean |log p_bf16 - log p_float32| per sampled token (measured on
SmolLM2-135M: 0.030 for vLLM in bf16, 0.023 for the learner under autocast)."""
MISMATCH_KL = 0.005
"""Largest mismatch KL (k3 estimator) between them (measured: 0.0010 and 0.0007)."""


@pytest.fixture
def cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point `auto` at a CPU description of the test's making."""

    def use(flags: str) -> None:
        path = tmp_path / f"cpuinfo-{len(flags)}"
        path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: fpu\n")
        monkeypatch.setenv("SARL_CPUINFO", str(path))
        precision.cpu_flags.cache_clear()

    yield use
    precision.cpu_flags.cache_clear()


@CPU_ONLY
def test_auto_is_float32_where_the_cpu_has_no_bf16_and_bf16_where_it_has(cpuinfo: Any) -> None:
    cpuinfo("fpu sse2 avx2 avx512f avx512bw avx512_vnni")  # AVX-512 without its bf16 instructions
    assert precision.engine_dtype("auto") == "float32" and precision.learner_precision("auto") == "float32"
    assert "no bf16" in precision.describe()
    for flags in ("fpu avx512f avx512_bf16", "fpu amx_tile amx_bf16"):
        cpuinfo(flags)
        assert precision.engine_dtype("auto") == "bfloat16" and precision.learner_precision("auto") == "bf16"
    assert precision.engine_dtype("float32") == "float32" and precision.learner_precision("bf16") == "bf16"


@CPU_ONLY
def test_a_learner_on_a_cpu_without_bf16_trains_in_float32(cpuinfo: Any, tiny_model: Path) -> None:
    from learner_runs import rollout_batches

    from rl.learner.config import LearnerRole
    from rl.learner.trainer import Trainer

    cpuinfo("fpu sse2 avx2 avx512f")
    trainer = Trainer(str(tiny_model), LearnerRole.model_validate({"samples_per_step": 4}))
    assert trainer.precision == "float32"
    assert trainer.step(rollout_batches(tiny_model, 2)[0]) is not None


@pytest.mark.parametrize("mode", ["bf16-autocast", "bf16"])
def test_a_step_in_bf16_moves_the_weights_as_float32_does(tiny_model: Path, mode: str) -> None:
    """The same step from the same weights in float32 and in a bf16 mode:
    close losses, and updates pointing the same way."""
    from learner_runs import rollout_batches

    from rl.learner.config import LearnerRole
    from rl.learner.trainer import Trainer

    batch = rollout_batches(tiny_model, 2)[0]
    moved, losses = {}, {}
    for how in ("float32", mode):
        lc = LearnerRole.model_validate({"samples_per_step": 4, "precision": how, "optimizer": {"lr": 1e-2}})
        t = Trainer(str(tiny_model), lc, seed=1)
        before = {k: v.float().clone() for k, v in t.state_dict().items()}
        metrics = t.step(batch)
        assert metrics is not None
        losses[how] = metrics["loss"]
        after = t.state_dict()
        moved[how] = torch.cat([(after[k].float() - before[k]).flatten() for k in before])
    cos = torch.nn.functional.cosine_similarity(moved["float32"], moved[mode], dim=0)
    assert float(cos) > 0.9 and losses["float32"] == pytest.approx(losses[mode], abs=0.05), (cos, losses)


def _mismatch(behaviour: torch.Tensor, learner: torch.Tensor) -> tuple[float, float]:
    d = behaviour - learner
    return float(d.abs().mean()), float((torch.exp(d) - 1 - d).mean())


@pytest.mark.slow
def test_bf16_behaviour_log_probs_are_within_the_stated_tolerance_of_float32() -> None:
    """vLLM in bf16 samples replies on SmolLM2-135M; the learner's float32
    log-probs of the same tokens, and its bf16-autocast ones, are within
    MEAN_ABS_NATS and MISMATCH_KL of the recorded behaviour log-probs (what
    the importance weights compare)."""
    from transformers import AutoModelForCausalLM

    from rl.engine import make_engine
    from rl.engine.config import SamplingParams, VLLMEngineConfig
    from rl.learner.logprobs import token_logprobs
    from rl.model import ModelConfig, chat_ids, checkpoint, load_tokenizer

    model = ModelConfig(dtype="bfloat16")
    tok = load_tokenizer(checkpoint(model))
    questions = ["Write a Python function that reverses a string.", "Explain what a hash map is."]
    prompts = [chat_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    engine = make_engine(VLLMEngineConfig(max_model_len=512), model)
    try:
        outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=48, n=4, seed=1))
    finally:
        engine.close()
    hf = AutoModelForCausalLM.from_pretrained(checkpoint(model), dtype=torch.float32)
    behaviour, learner = [], {False: [], True: []}
    for p, row in zip(prompts, outs, strict=True):
        for c in row:
            ids = torch.tensor([p + c.token_ids])
            mask = torch.tensor([[0.0] * len(p) + [1.0] * len(c.token_ids)])
            behaviour.append(torch.tensor(c.logprobs))
            for autocast in (False, True):
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    learner[autocast].append(token_logprobs(hf, ids, torch.ones_like(ids), mask)[0][mask[:, 1:] > 0])
    b = torch.cat(behaviour)
    assert len(b) > 200
    for autocast in (False, True):
        mean_abs, kl = _mismatch(b, torch.cat(learner[autocast]))
        assert mean_abs < MEAN_ABS_NATS and kl < MISMATCH_KL, (autocast, mean_abs, kl)
        assert mean_abs > 1e-4  # bf16 is not float32: the check compares two different computations
