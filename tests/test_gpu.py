"""On a CUDA device: a learner step and a generation, with the real trainer
(DeepSpeed) and the real HF engine on the tiny model. Collected everywhere;
where torch sees no CUDA device they are skipped, and the skip says why.
Run them alone on a GPU node with `scripts/test.sh -m gpu`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch.cuda.is_available() is False"),
]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("precision", ["auto", "float32", "bf16-autocast", "bf16"])
def test_a_learner_step_on_cuda_moves_the_weights_and_reports_finite_figures(
    tiny_model: Path, precision: str, lora: bool
) -> None:
    from rl.learner.config import LearnerRole
    from rl.learner.trainer import Trainer
    from rl.store import Sample

    raw = {"samples_per_step": 4, "optimizer": {"lr": 1e-2}, "precision": precision}
    lc = LearnerRole.model_validate(raw | ({"lora": {"rank": 4}} if lora else {}))
    trainer = Trainer(str(tiny_model), lc)
    assert trainer.engine.device.type == "cuda"
    if precision == "auto":  # a device that multiplies in bf16 trains under autocast
        assert trainer.precision == ("bf16-autocast" if torch.cuda.is_bf16_supported() else "float32")
    before = {k: v.detach().float().cpu().clone() for k, v in trainer.state_dict().items()}
    ids = np.arange(3, 19, dtype=np.int32)
    mask = np.array([0] * 6 + [1] * 10, dtype=np.uint8)
    samples = [
        Sample("t", g, 0, ids, mask, np.full(len(ids), -2.0, np.float32), reward)
        for g, reward in ((0, 1.0), (0, 0.0), (1, 1.0), (1, 0.0))
    ]
    metrics = trainer.step(samples)
    assert metrics is not None and all(np.isfinite(v) for v in metrics.values()), metrics
    after = trainer.state_dict()
    moved = max(float((after[k].detach().float().cpu() - before[k]).abs().max()) for k in before)
    assert moved > 0  # the step changed the weights on the device
    if lora:
        assert all(".lora_" in k for k in after) and trainer.adapter_record() is not None


def test_a_bf16_engine_on_cuda_merges_a_lora_version_as_the_adapter_computes(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig
    from rl.engine.lora import adapter_tensors
    from rl.learner.config import LoraSection
    from rl.learner.trainer import with_lora
    from rl.model import ModelConfig
    from rl.store.weights import WeightStore

    model = with_lora(AutoModelForCausalLM.from_pretrained(tiny_model), LoraSection(rank=4, alpha=8.0), 0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.5)
    store = WeightStore(tmp_path / "store.zarr")
    store.publish(adapter_tensors(model), version=1, dtype=None, adapter={"rank": 4, "alpha": 8.0, "scale": 2.0})
    engine = make_engine(HFEngineConfig(max_model_len=256), ModelConfig(path=str(tiny_model), dtype="auto"))
    try:
        assert next(engine.model.parameters()).dtype == (  # type: ignore[attr-defined]
            torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        )
        engine.load_version(str(tmp_path / "store.zarr"), 1)
        ids = torch.tensor([list(range(5, 40))])
        with torch.no_grad():
            got = engine.model(input_ids=ids.cuda()).logits.float().cpu()  # type: ignore[attr-defined]
            want = model.eval()(input_ids=ids).logits.float()
    finally:
        engine.close()
    assert float((got - want).abs().max()) < 0.1 * float(want.abs().max())  # bf16 of the same model


def test_a_generation_on_cuda_gives_token_ids_and_their_log_probs(tiny_model: Path) -> None:
    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig, SamplingParams
    from rl.model import ModelConfig

    engine = make_engine(HFEngineConfig(max_model_len=256), ModelConfig(path=str(tiny_model), dtype="float32"))
    try:
        assert next(engine.model.parameters()).device.type == "cuda"  # type: ignore[attr-defined]
        out = engine.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    finally:
        engine.close()
    c = out[0][0]
    assert len(c.token_ids) == 8 and len(c.logprobs) == 8
    assert all(0 <= t < engine.vocab_size for t in c.token_ids)
    assert all(lp <= 0.0 and np.isfinite(lp) for lp in c.logprobs)
