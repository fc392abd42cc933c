"""`sarl bench rl --quick`: a sync run and an async run of all three roles on
the local executor, each role pinned to its cores, and the figures read back
from their TensorBoard events. On the tiny model, so that it takes a minute;
the speed figures are the full benchmark's business (docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import sarl


@pytest.mark.slow
def test_bench_rl_quick_runs_both_modes_on_pinned_cores_and_reports_rates_and_idle_ratios(
    workdir: Path, tiny_model: Path
) -> None:
    out = sarl("bench", "rl", "--quick", "--json", "--dir", "w", "--model", str(tiny_model), "--timeout", "600",
               cwd=workdir, timeout=1500)  # fmt: skip
    r = json.loads(out.stdout)
    assert r["quick"] is True and r["steps"] == 3 and r["samples_per_step"] == 2
    for mode in ("sync", "async"):
        assert r[f"{mode}_samples_s"] > 0 and r[f"{mode}_window_s"] > 0
        for role in ("generator", "learner", "rollout"):
            assert 0.0 <= r[f"{mode}_idle_{role}"] <= 1.0, (mode, role)
        # the generator's weight loading is counted apart from its waiting (the tiny
        # model loads a version in milliseconds: its share of the window rounds to 0)
        busy, swap, idle = (r[f"{mode}_{k}_generator"] for k in ("busy", "swap", "idle"))
        assert swap >= 0 and idle == pytest.approx(max(0.0, 1.0 - busy - swap), abs=1e-3), r
        run = workdir / "w" / mode / "runs" / mode
        frozen = (run / "run.toml").read_text()
        assert f'mode = "{mode}"' in frozen
        cores = {"generator": r["generator_cores"], "rollout": r["generator_cores"], "learner": r["learner_cores"]}
        for role, want in cores.items():
            state = json.loads((run / "checkpoints" / role / "task-000000.json").read_text())
            assert state["starts"][-1]["cpus"] == want, (mode, role, state["starts"])
        learner = json.loads((run / "checkpoints" / "learner" / "task-000000.json").read_text())
        assert learner["done"] and learner["step"] == 3
        from rl.run.report import read_curves

        loaded = read_curves(run / "tb")["generator-000000"]["generator/swap_s"]
        assert loaded[-1][2] > 0, loaded  # seconds spent loading the 3 published versions
    assert set(r["generator_cores"]).isdisjoint(r["learner_cores"])
    assert r["ratio"] == pytest.approx(r["async_samples_s"] / r["sync_samples_s"], rel=0.01)
