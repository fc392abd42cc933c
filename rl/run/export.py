"""`sarl export RUN_DIR -o DIR`: a published weight version as a Hugging Face
checkpoint folder (config.json, model.safetensors, the tokenizer), which
`transformers`, vLLM, or another run's `[model] path` loads as it is.

The folder is the base model's folder with the version's weights in place of
its own, and `sarl-export.json` saying where they came from. A version of
LoRA adapters (a run with `[learner.lora]`) is merged into the base's
weights (rl.engine.lora), each merged weight in the base's own dtype: the
folder is a plain checkpoint that needs no adapter support to load. It is built
under a temporary name and committed with one rename: an interrupted export
leaves nothing at DIR. Every checksum of the version is verified on the way.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from rl.errors import SarlError
from rl.fsio import commit_dir

PROVENANCE = "sarl-export.json"
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json", PROVENANCE)


class ExportError(SarlError, ValueError):
    """The version or the destination of an export is not usable."""


def export(run_dir: Path, out: Path, version: int | None = None) -> dict[str, Any]:
    """Write `version` (default: the newest) of the run's weights to `out`;
    what was written, as `sarl-export.json` records it."""
    from safetensors.torch import save_file

    from rl.model import checkpoint
    from rl.run.rundir import RunDir
    from rl.store import Store

    rd = RunDir(run_dir)
    cfg = rd.config()
    base = checkpoint(cfg.model)
    weights = Store.of_run(rd.path).weights
    published = weights.versions()
    if version is None:
        if not published:
            raise ExportError(f"{rd.path}: no version is published yet (version 0 is the base model, {base})")
        version = published[-1]
    if version == 0:
        raise ExportError(f"--version 0 is the base model itself: {base}")
    if version not in published:
        raise ExportError(f"--version {version}: not in the store (it has {published or 'none'})")
    out = Path(out).resolve()
    if out.exists():
        raise ExportError(f"{out}: exists; export writes a new folder")
    _, tensors = weights.load(version, verify=True)
    adapter = weights.adapter(version)
    if adapter is not None:
        tensors = _merged(base, tensors, float(adapter["scale"]))
    record = {
        "run": str(rd.path),
        "version": version,
        "base": str(base),
        "dtype": cfg.model.dtype,
        "tensors": len(tensors),
        "adapter": adapter,
        "exported_at": time.time(),
    }

    def build(tmp: Path) -> None:
        for item in base.iterdir():  # config, tokenizer, generation config: the base's own
            if item.is_file() and not any(item.match(p) for p in _WEIGHT_FILES):
                shutil.copy2(item, tmp / item.name)
        # the store's tensors are views of read-only mappings: safetensors copies them out
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
        (tmp / PROVENANCE).write_text(json.dumps(record, indent=1) + "\n")

    if not commit_dir(out, build):
        raise ExportError(f"{out}: another export committed it first")
    return {**record, "folder": str(out)}


def _merged(base: Path, adapter: dict[str, Any], scale: float) -> dict[str, Any]:
    """The base folder's weights with the adapters merged, each in the base's dtype."""
    from safetensors.torch import load_file

    from rl.engine.lora import merged

    own: dict[str, Any] = {}
    for f in sorted(base.glob("*.safetensors")):
        own.update(load_file(str(f)))
    try:
        out = merged(own, adapter, scale)
    except ValueError as e:
        raise ExportError(f"the version's adapters do not fit the base model {base}: {e}") from None
    return {k: v.to(own[k].dtype) for k, v in out.items()}
