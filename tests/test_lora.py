"""LoRA end to end: the learner trains adapters alone, publishes them alone,
every engine merges them into its base and answers as the trained model
does, a corrupt or misfitting adapter is refused, and a LoRA run exports a
plain checkpoint and is served."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from conftest import sarl, task_state, wait_for, write_config
from learner_runs import learner_state, rollout_batches

from rl.store.weights import WeightStore

LORA = {"rank": 4, "alpha": 8.0}


def _trainer(tiny_model: Path, **lora: Any) -> Any:
    from rl.learner.config import LearnerRole
    from rl.learner.trainer import Trainer

    lc = LearnerRole.model_validate(
        {"samples_per_step": 4, "precision": "float32", "lora": {**LORA, **lora}, "optimizer": {"lr": 1e-2}}
    )
    return Trainer(str(tiny_model), lc, seed=1)


def _logits(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def test_a_lora_learner_trains_adapters_alone_and_an_engine_merges_them_into_what_it_trained(
    tiny_model: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    from rl.engine.config import HFEngineConfig
    from rl.engine.hf import HFEngine

    trainer = _trainer(tiny_model)
    base = load_file(str(tiny_model / "model.safetensors"))
    batch = rollout_batches(tiny_model, 2)[0]
    for _ in range(3):
        assert trainer.step(batch) is not None
    module = trainer.engine.module
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)  # the base is frozen
    moments = [s for s in trainer.engine.optimizer.state.values() if s]
    assert len(moments) == len(trained)  # AdamW keeps moments for the adapters alone
    for name, w in module.get_base_model().state_dict().items():  # the base weights did not move
        key = name.replace(".base_layer", "")
        if key in base:
            assert torch.equal(w, base[key]), name

    adapters = trainer.state_dict()
    assert set(adapters) == {
        f"model.layers.{i}.{m}.lora_{ab}.weight"
        for i in range(2)
        for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
        + ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        for ab in "AB"
    }
    store = WeightStore(tmp_path / "store.zarr")
    store.publish(adapters, version=1, dtype=None, adapter=trainer.adapter_record())
    assert store.adapter(1) == {"rank": 4, "alpha": 8.0, "scale": 2.0}
    full = sum(t.numel() for t in base.values())
    assert store.manifest(1)["blob_bytes"] < 0.2 * 4 * full  # a few adapters, not the weights

    engine = HFEngine(tiny_model, "float32", HFEngineConfig(max_model_len=256))
    ids = [int(t) for t in batch[0].tokens[:40]]
    before = _logits(engine.model, ids)
    engine.load_version(str(tmp_path / "store.zarr"), 1)
    module.eval()
    want = _logits(module, ids)
    assert engine.version == 1 and float((want - before).abs().max()) > 1e-2  # training changed the model
    assert torch.allclose(_logits(engine.model, ids), want, atol=1e-4)  # the merge is what was trained


def test_a_corrupt_adapter_or_one_for_another_base_is_refused_and_the_engine_keeps_its_weights(
    tiny_model: Path, tmp_path: Path
) -> None:
    import torch

    from rl.engine.config import HFEngineConfig
    from rl.engine.hf import HFEngine
    from rl.store import CorruptData, StoreError

    trainer = _trainer(tiny_model)
    trainer.step(rollout_batches(tiny_model, 2)[0])
    adapters, record = trainer.state_dict(), trainer.adapter_record()
    store = WeightStore(tmp_path / "store.zarr")
    store.publish(adapters, version=1, dtype=None, adapter=record, full_every=1)
    store.publish(adapters, version=2, dtype=None, adapter=record, full_every=1)
    name = "model.layers.1.mlp.down_proj.lora_B.weight"
    e = store.manifest(2)["tensors"][name]
    with open(store.path(e["stored_in"]) / "data" / "c.0", "r+b") as f:  # a bad disk flips one bit
        f.seek(e["offset"] + 8)
        b = f.read(1)
        f.seek(e["offset"] + 8)
        f.write(bytes([b[0] ^ 1]))
    wide = {k: (torch.zeros(v.shape[0], 99) if k.endswith("lora_A.weight") else v) for k, v in adapters.items()}
    store.publish(wide, version=3, dtype=None, adapter=record, full_every=1)
    unknown = {k.replace("down_proj", "side_proj"): v for k, v in adapters.items()}
    store.publish(unknown, version=4, dtype=None, adapter=record, full_every=1)

    engine = HFEngine(tiny_model, "float32", HFEngineConfig(max_model_len=256))
    ids = list(range(5, 30))
    before = _logits(engine.model, ids)
    for version, error, says in [
        (2, CorruptData, "down_proj.lora_B.weight: checksum mismatch"),
        (3, StoreError, "do not make its weight"),
        (4, StoreError, "side_proj.weight, which the base model"),
    ]:
        with pytest.raises(error, match=says):
            engine.load_version(str(tmp_path / "store.zarr"), version)
        assert engine.version == 0 and torch.equal(_logits(engine.model, ids), before)


def _lora_run(workdir: Path, tiny_model: Path, steps: int) -> Path:
    from learner_runs import commit_rollouts, learner_config

    learner = {"keep_versions": 2, "lora": {"rank": LORA["rank"], "alpha": LORA["alpha"]}}
    cfg = write_config(workdir, learner_config(tiny_model, steps, learner))
    sarl("submit", str(cfg), "--cluster", "local", cwd=workdir)
    run = workdir / "runs" / "l"
    commit_rollouts(run, tiny_model, groups=2 * steps)
    return run


@pytest.mark.slow
def test_a_lora_run_stores_adapters_alone_exports_a_plain_checkpoint_and_is_served(
    workdir: Path, tiny_model: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rl.engine.config import HFEngineConfig, SamplingParams
    from rl.engine.hf import HFEngine

    run = _lora_run(workdir, tiny_model, steps=4)
    try:
        wait_for(lambda: learner_state(run).get("done"), 600, "the LoRA learner")
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
    store = WeightStore(run / "store.zarr")
    assert store.versions() == [3, 4]  # keep_versions = 2
    assert all(store.adapter(v) is not None for v in store.versions())
    state = task_state(run, 0, "learner")
    assert state["precision"] in ("float32", "bf16") and 0 < state["weight_change"] < 1
    # the checkpoint holds the adapters and their moments, not the frozen base
    ck = max((run / "checkpoints" / "learner").glob("step-*"))
    weights = sum(f.stat().st_size for f in tiny_model.glob("*.safetensors"))
    assert sum(f.stat().st_size for f in ck.rglob("*") if f.is_file()) < weights

    out = workdir / "export"
    sarl("export", str(run), "-o", str(out), cwd=workdir)
    record = json.loads((out / "sarl-export.json").read_text())
    assert record["version"] == 4 and record["adapter"]["scale"] == 2.0
    plain = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)  # no adapter support needed
    engine = HFEngine(tiny_model, "float32", HFEngineConfig(max_model_len=256))
    engine.load_version(str(run / "store.zarr"), 4)
    ids = list(range(5, 40))
    assert torch.allclose(_logits(plain, ids), _logits(engine.model, ids), atol=1e-5)
    assert not torch.allclose(_logits(plain, ids), _logits(AutoModelForCausalLM.from_pretrained(tiny_model), ids))

    from test_gateway import _serve

    p = _serve([str(run), "--engine", "hf", "--version", "4", "--port", "0"], {"SARL_API_KEY": "sk-t"})
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "(weight version 4)" in line, line
        client = openai.OpenAI(base_url=line.split(" at ")[1].strip(), api_key="sk-t", max_retries=0)
        got = client.completions.create(model="l", prompt=[ids], max_tokens=6, temperature=0)
        want = engine.generate([ids], SamplingParams(temperature=0, max_tokens=6))
        assert got.choices[0].text == engine.tokenizer.decode(want[0][0].token_ids)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0


def test_a_lora_config_is_checked_before_submission(workdir: Path, tiny_model: Path) -> None:
    from learner_runs import learner_config

    for learner, says in [
        ({"train_top_layers": 1, "lora": {"rank": 4}}, "choose one way"),
        ({"lora": {"rank": 0}}, "learner.lora.rank"),
        ({"bf16": True}, "replaced by `precision`"),
    ]:
        cfg = write_config(workdir, learner_config(tiny_model, 2, learner))
        out = sarl("submit", str(cfg), "--cluster", "local", cwd=workdir, check=False)
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert not (workdir / "runs").exists()


def test_adapter_factors_merge_as_lora_defines_them() -> None:
    import torch

    from rl.engine.lora import merged

    torch.manual_seed(0)
    w = torch.randn(6, 5)
    a, b = torch.randn(2, 5), torch.randn(6, 2)
    out = merged({"m.weight": w, "n.weight": w}, {"m.lora_A.weight": a, "m.lora_B.weight": b}, 0.5)
    assert torch.allclose(out["m.weight"], w + 0.5 * b @ a) and out["n.weight"] is w
    with pytest.raises(ValueError, match="lack their pair"):
        merged({"m.weight": w}, {"m.lora_A.weight": a}, 1.0)
    assert np.isclose(float(out["m.weight"].sum()), float((w + 0.5 * b @ a).sum()))


def _random_adapter(folder: Path, seed: int, std: float) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """An adapter whose B factors are not zero (it changes the model), its
    record, and the peft model that computes with it unmerged."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl.engine.lora import adapter_tensors
    from rl.learner.config import LoraSection
    from rl.learner.trainer import with_lora

    model = with_lora(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), LoraSection(**LORA), seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return adapter_tensors(model), {"rank": 4, "alpha": 8.0, "scale": 2.0}, model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_a_generator_serves_each_new_adapter_version_after_its_publish(
    workdir: Path, tiny_model: Path, backend: str
) -> None:
    """The generator role (HF on the tiny model; vLLM on SmolLM2-135M, whose
    worker merges into its resident base) answers greedy requests, after
    each publish of an adapter version, as the unmerged peft model does."""
    import torch
    from generation_weights import GREEDY
    from test_generator_role import _generator_config, _wait_endpoints

    from rl.model import ModelConfig, checkpoint
    from rl.serving.client import GeneratorClient

    folder = tiny_model if backend == "hf" else checkpoint(ModelConfig(dtype="float32"))
    cfg = write_config(workdir, _generator_config(folder, backend, 1, "local"))
    sarl("submit", str(cfg), cwd=workdir)
    run = workdir / "runs" / "g"
    store = WeightStore(run / "store.zarr")
    from rl.model import chat_ids, load_tokenizer

    prompt = chat_ids(load_tokenizer(folder), [{"role": "user", "content": "Name three colours."}])
    try:
        _wait_endpoints(run, 1, 600)
        client = GeneratorClient(run, timeout_s=120)
        base = client.generate([prompt], GREEDY).outputs[0][0].token_ids
        answers = []
        for version, seed in ((1, 11), (2, 12)):
            adapter, record, peft_model = _random_adapter(folder, seed, 2.0 if backend == "hf" else 0.1)
            store.publish(adapter, version=version, dtype=None, adapter=record)
            _wait_endpoints(run, 1, 120, version=version)
            got = client.generate([prompt], GREEDY)
            with torch.no_grad():
                out = peft_model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY.max_tokens, do_sample=False)
            want = out[0, len(prompt) :].tolist()
            assert got.version == version and got.outputs[0][0].token_ids == want[: len(got.outputs[0][0].token_ids)]
            answers.append(want)
        assert base != answers[0] != answers[1]  # each version's adapters changed the answers
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
