"""`sarl export`: a published version as a checkpoint folder that transformers
loads with exactly the stored weights, and that another run's `[model] path`
accepts; bad versions and destinations refused with nothing written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from conftest import run_config, sarl, write_config


def _run_with_versions(workdir: Path, tiny_model: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A run directory whose store holds version 1: the tiny model, perturbed."""
    from transformers import AutoModelForCausalLM

    from rl.store.weights import WeightStore

    run = workdir / "runs" / "x"
    (run / "store.zarr").mkdir(parents=True)
    model = {"path": tiny_model, "dtype": "float32"}
    (run / "run.toml").write_text(
        run_config("x", run={"root": ".."}, executor={"type": "local"}, model=model, smoke={})
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    torch.manual_seed(1)
    weights = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
    WeightStore(run / "store.zarr").publish(weights, version=1, dtype="float32")
    return run, weights


def test_export_writes_the_version_as_a_checkpoint_another_run_starts_from(workdir: Path, tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rl.config import load_config

    run, weights = _run_with_versions(workdir, tiny_model)
    out = sarl("export", str(run), "-o", "exported", "--json", cwd=workdir)
    done = json.loads(out.stdout)
    folder = workdir / "exported"
    assert done["version"] == 1 and done["folder"] == str(folder) and done["run"] == str(run)
    assert json.loads((folder / "sarl-export.json").read_text())["version"] == 1
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)  # the stored bytes, not the base's
    # another run's [model] path accepts it
    body = run_config("next", executor={"type": "local"}, model={"path": folder}, smoke={})
    assert load_config(write_config(workdir, body)).model.path == str(folder)


def test_bad_exports_are_refused_with_nothing_written(workdir: Path, tiny_model: Path) -> None:
    import pytest

    from rl.run.export import ExportError, export

    run, _ = _run_with_versions(workdir, tiny_model)
    r = sarl("export", str(run), "-o", "out", "--version", "0", cwd=workdir, check=False)
    assert r.returncode == 1 and "sarl export: --version 0 is the base model itself" in r.stderr, r.stderr
    (workdir / "taken").mkdir()
    empty = workdir / "runs" / "empty"
    (empty / "store.zarr").mkdir(parents=True)
    (empty / "run.toml").write_text((run / "run.toml").read_text().replace('name = "x"', 'name = "empty"'))
    for source, out, version, words in [
        (run, "out", 7, "--version 7: not in the store (it has [1])"),
        (run, "taken", None, "taken: exists"),
        (empty, "out", None, "no version is published yet"),
    ]:
        with pytest.raises(ExportError, match=re.escape(words)):
            export(source, workdir / out, version)
    assert not (workdir / "out").exists() and not list((workdir / "taken").iterdir())
    assert not [p.name for p in workdir.iterdir() if p.name.startswith(".")]  # no temporary folder left
    r = sarl("export", str(workdir / "nowhere"), "-o", "out", cwd=workdir, check=False)
    assert r.returncode != 0 and "not a run directory" in r.stderr
