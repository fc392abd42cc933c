"""Helpers of the generation tests: prompts of the built-in model's chat
template, and weight versions that answer differently or are corrupt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl.engine.config import SamplingParams
from rl.model import ModelConfig, chat_ids, checkpoint
from rl.store.weights import WeightStore

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def prompt(tok: Any, text: str) -> list[int]:
    return chat_ids(tok, [{"role": "user", "content": text}])


def perturbed(model: ModelConfig | Path, layer: int = 3, scale: float = 1.3) -> dict[str, Any]:
    """The base weights (of the built-in model, or of a checkpoint folder) with
    one layer scaled: a policy that answers differently."""
    from safetensors.torch import load_file

    folder = model if isinstance(model, Path) else checkpoint(model)
    sd = load_file(str(folder / "model.safetensors"))
    return {k: (v * scale if f"layers.{layer}." in k else v) for k, v in sd.items()}


def base(model: ModelConfig) -> dict[str, Any]:
    return perturbed(model, scale=1.0)


def two_versions(model: ModelConfig, folder: Path) -> tuple[str, WeightStore]:
    """A store holding the base weights as version 0 and a perturbed policy as 1."""
    store = str(folder / "store.zarr")
    ws = WeightStore(store)
    ws.publish(base(model), version=0, dtype="float32")
    ws.publish(perturbed(model), version=1, dtype="float32")
    return store, ws


def corrupt(ws: WeightStore, version: int, name: str = "model.layers.3.mlp.up_proj.weight") -> None:
    """Flip one bit of one tensor of a committed version, as a bad disk would."""
    e = ws.manifest(version)["tensors"][name]
    assert e["stored_in"] == version  # its bytes are this version's own, not shared with an older one
    with open(ws.path(version) / "data" / "c.0", "r+b") as f:
        f.seek(e["offset"] + 100)
        b = f.read(1)
        f.seek(e["offset"] + 100)
        f.write(bytes([b[0] ^ 1]))
