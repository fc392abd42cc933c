"""LoRA adapters as the store keeps them, and merged into a base model.

A LoRA run's learner (rl.learner.trainer) publishes each weight version as
its adapters alone: for every adapted linear layer `M` of the base model
(Hugging Face names), `M.lora_A.weight` (rank x in) and `M.lora_B.weight`
(out x rank), in float32, with the manifest's `adapter` record saying the
rank, alpha and scale (alpha / rank). A reader merges them into the base:

    M.weight = base M.weight + scale x lora_B @ lora_A

Engines keep a resident float32 copy of the base and merge each new
version into it (docs/generation.md says why not vLLM's own LoRA); `sarl
export` merges one into a plain checkpoint folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

A, B = ".lora_A.weight", ".lora_B.weight"


def adapter_tensors(model: Any) -> dict[str, Any]:
    """A peft model's adapter weights under the store's names (the base
    module's Hugging Face name + `.lora_A.weight` / `.lora_B.weight`),
    detached, on the CPU, in float32."""
    out = {}
    for name, p in model.named_parameters():
        if ".lora_A." not in name and ".lora_B." not in name:
            continue
        # base_model.model.<hf name>.lora_A.default.weight -> <hf name>.lora_A.weight
        hf = name.removeprefix("base_model.model.")
        module, _, rest = hf.partition(".lora_")
        which = rest.split(".", 1)[0]  # A or B
        out[f"{module}.lora_{which}.weight"] = p.detach().float().cpu().contiguous()
    return out


def adapted_modules(adapter: Mapping[str, Any]) -> list[str]:
    """The base modules an adapter changes, each with both of its factors;
    a ValueError if one is missing its pair."""
    mods = {k.removesuffix(A) for k in adapter if k.endswith(A)}
    other = {k.removesuffix(B) for k in adapter if k.endswith(B)}
    odd = sorted(mods ^ other) + sorted(k for k in adapter if not k.endswith((A, B)))
    if odd:
        raise ValueError(f"not an adapter: {odd[:5]} lack their pair or are not LoRA factors")
    return sorted(mods)


def deltas(adapter: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """`M.weight` -> scale x B @ A, in float32, for every adapted module."""
    return {
        f"{m}.weight": (adapter[m + B].float() @ adapter[m + A].float()).mul_(scale) for m in adapted_modules(adapter)
    }


def delta_norm2(adapter: Mapping[str, Any], scale: float) -> float:
    """The squared Frobenius norm of every adapter's scale x B A together,
    from rank x rank products alone: ||B A||^2 = trace((B^T B)(A A^T))."""
    import torch

    total = 0.0
    for m in adapted_modules(adapter):
        a, b = adapter[m + A].double(), adapter[m + B].double()
        total += float(torch.trace((b.T @ b) @ (a @ a.T)))
    return scale * scale * total


def merged(
    base: Mapping[str, Any], adapter: Mapping[str, Any], scale: float, into: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every tensor of `base`, with each adapted weight replaced by base +
    scale x B @ A (float32), written into `into`'s tensor of that name when
    it has one (reused buffers: fresh ones cost page faults, 0.5 s a merge
    for SmolLM2-135M on 2 cores). A ValueError names a module the base does
    not have or whose shape the adapter does not fit."""
    import torch

    out = dict(base)
    for m in adapted_modules(adapter):
        name, a, b = f"{m}.weight", adapter[m + A].float(), adapter[m + B].float()
        w = base.get(name)
        if w is None:
            raise ValueError(f"the adapter changes {name}, which the base model does not have")
        if tuple(w.shape) != (b.shape[0], a.shape[1]) or a.shape[0] != b.shape[1]:
            raise ValueError(
                f"the adapter's factors of {m} ({tuple(b.shape)} x {tuple(a.shape)}) do not fit {name} {tuple(w.shape)}"
            )
        buf = None if into is None else into.get(name)
        if buf is not None and (buf.shape != w.shape or buf.dtype != torch.float32):
            buf = None
        out[name] = torch.addmm(w.float(), b, a, alpha=scale, out=buf)  # one pass: w + scale x B @ A
    return out


def check_fits(adapter: Mapping[str, Any], folder: str | os.PathLike[str]) -> None:
    """A ValueError naming the first adapted module that the base model in
    `folder` does not have, or whose shape the factors do not make; read
    from the safetensors headers alone."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            shapes.update({k: tuple(sf.get_slice(k).get_shape()) for k in sf.keys()})  # noqa: SIM118
    for m in adapted_modules(adapter):
        a, b = adapter[m + A], adapter[m + B]
        want = shapes.get(f"{m}.weight")
        if want is None:
            raise ValueError(f"the adapter changes {m}.weight, which the base model in {folder} does not have")
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != want:
            raise ValueError(
                f"the adapter's factors of {m} ({tuple(b.shape)} x {tuple(a.shape)}) do not make its weight {want}"
            )


def read_base(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint folder's weights (every `*.safetensors` file), in float32."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights to merge an adapter into")
    for f in files:
        out.update({k: v.float() for k, v in load_file(str(f)).items()})
    return out


class ResidentBase:
    """An engine's float32 copy of its base weights, read once, into which
    each adapter version is merged (the base itself never changes)."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        self._weights: dict[str, Any] | None = None
        self._merged: dict[str, Any] = {}
        """The last merge's adapted weights, whose memory the next one reuses."""

    def merge(self, adapter: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
        """The base with `adapter` merged, `record` being the manifest's
        `adapter` entry (its `scale`)."""
        if self._weights is None:
            self._weights = read_base(self.folder)
        out = merged(self._weights, adapter, float(record["scale"]), into=self._merged)
        self._merged = {k: v for k, v in out.items() if v is not self._weights.get(k)}
        return out
