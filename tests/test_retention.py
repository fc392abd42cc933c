"""Run folders that fit a quota: the learner keeps the newest
`keep_versions` weight versions (3 by default), and besides them only what a
reader still needs: a version pinned while it loads, and the versions the
run's evaluator has yet to evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rl.store.weights import WeightStore


def _training(tmp_path: Path, tiny_model: Path, every: int | None) -> object:
    from rl.config import validate_config
    from rl.learner.training import Training
    from rl.run.role import context_of

    raw = {
        "run": {"name": "r", "root": str(tmp_path)},
        "executor": {"type": "local"},
        "model": {"path": str(tiny_model), "dtype": "float32"},
        "learner": {"steps": 20},
    }
    if every is not None:
        held = tmp_path / "held.jsonl"
        from rl.tasks.format import write_tasks
        from rl.tasks.synthesis import synthesize

        write_tasks(held, synthesize("all", 2, seed=1))
        raw["eval"] = {"tasks_file": str(held), "every": every}
    cfg = validate_config(raw, "test", cluster="local", base_dir=tmp_path)
    assert cfg.learner is not None and cfg.learner.keep_versions == 3 and cfg.learner.eval_every == every
    cfg.run_dir.mkdir(parents=True)
    return Training(context_of(cfg, cfg.run_dir), cfg.learner)


def test_retention_keeps_the_versions_the_evaluator_has_yet_to_evaluate(tmp_path: Path, tiny_model: Path) -> None:
    t = _training(tmp_path, tiny_model, every=4)
    store = WeightStore(t.ctx.run_dir / "store.zarr")  # type: ignore[attr-defined]
    for v in range(1, 11):
        store.publish({"w": torch.full((4,), float(v))}, version=v, full_every=1)
    state = t.ctx.layout.state_path("eval", 0)  # type: ignore[attr-defined]
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"evaluated": {"0": {}, "4": {}}}))
    kept = t._not_yet_evaluated()  # type: ignore[attr-defined]
    assert kept == {8}  # 4 is evaluated; 8 is due; the rest are not the evaluator's
    store.retain(1, also_keep=kept)
    assert store.versions() == [8, 10]
    untouched = _training(tmp_path / "no-eval", tiny_model, every=None)
    assert untouched._not_yet_evaluated() == set()  # type: ignore[attr-defined]


def test_status_shows_the_run_folders_disk_use_as_du_counts_it(workdir: Path, monkeypatch: object) -> None:
    import subprocess
    from collections import namedtuple

    from conftest import sarl, smoke_config, status, wait_for, write_config

    from rl.run import disk

    cfg = write_config(workdir, smoke_config(workers=2, steps=2, step_s=0.1))
    sarl("submit", str(cfg), "--cluster", "local", cwd=workdir)
    run = workdir / "runs" / "t"
    wait_for(lambda: all(t["status"] == "DONE" for t in status(run)["roles"]["smoke"]["detail"]), 120, "the run")
    (run / "store.zarr" / "weights" / "v0000000001").mkdir(parents=True)
    (run / "store.zarr" / "weights" / "v0000000001" / "c.0").write_bytes(b"w" * 3_000_000)
    step = run / "checkpoints" / "learner" / "step-0000000001"
    step.mkdir(parents=True)
    (step / "ds.pt").write_bytes(b"c" * 2_000_000)
    (run / "tb" / "x").write_bytes(b"t" * 100_000)
    got = status(run)["disk"]
    du = int(subprocess.run(["du", "-sB1", str(run)], capture_output=True, text=True, check=True).stdout.split()[0])
    assert abs(got["total"] - du) <= 0.01 * du, (got, du)
    assert got["weights"] >= 3_000_000 and got["checkpoints"] >= 2_000_000 and got["tensorboard"] >= 100_000
    assert sum(got[k] for k in ("weights", "rollouts", "checkpoints", "logs", "tensorboard", "other")) == got["total"]
    assert got["warning"] == "" and got["next_checkpoint"] >= 2_000_000
    text = sarl("status", str(run), cwd=workdir).stdout
    assert "disk: " in text and "weights 3.0 MB" in text and "free" in text

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 10**6, 10**6))  # type: ignore[attr-defined]
    low = disk.disk_use(run)
    assert "less than the next learner checkpoint needs" in low["warning"]
