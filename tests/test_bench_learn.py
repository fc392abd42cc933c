"""`sarl bench learn --quick`: the quickstart's chain end to end (tasks,
the SFT warm start, export, RL from the export with all three roles,
evaluations before and after), on the tiny model so that it takes minutes.
Whether the chain learns is the full benchmark's business (docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import sarl


@pytest.mark.slow
def test_bench_learn_quick_runs_the_quickstart_chain_and_reports_before_and_after(
    workdir: Path, tiny_model: Path
) -> None:
    out = sarl("bench", "learn", "--quick", "--json", "--dir", "w", "--model", str(tiny_model), cwd=workdir,
               timeout=1200)  # fmt: skip
    r = json.loads(out.stdout)
    for f in ("pass1_before", "pass1_after"):
        assert 0.0 <= r[f] <= 1.0, f
    assert r["tasks"] == 6 and r["gain_se"] >= 0.0
    assert r["gain"] == pytest.approx(r["pass1_after"] - r["pass1_before"], abs=1e-3)
    assert not any(k.startswith("humaneval_") for k in r)  # --quick evaluates the generated tasks alone
    assert r["quick"] is True and r["minutes"] >= r["minutes_sft"] + r["minutes_rl"] > 0
    w = workdir / "w"
    sft, rl = w / "runs" / "quickstart-sft", w / "runs" / "quickstart-rl"
    export = json.loads((sft / "model" / "sarl-export.json").read_text())
    assert export["version"] == 2 and export["run"] == str(sft)  # the warm start's last version
    frozen = (rl / "run.toml").read_text()
    assert str(sft / "model") in frozen and 'mode = "sync"' in frozen  # RL started from the export
    state = json.loads((rl / "checkpoints" / "learner" / "task-000000.json").read_text())
    assert state["done"] and state["step"] == 2
    # every role of the RL run ended by itself: the generator with the learner and the rollouts
    for role in ("generator", "rollout", "learner"):
        assert json.loads((rl / "checkpoints" / role / "task-000000.json").read_text())["done"], role
    # the evaluations' per-task results are in the runs
    assert (sft / "eval" / "v000000" / "gen.heldout" / "results.jsonl").is_file()
    assert not (sft / "store.zarr").exists()  # weights dropped at the end unless --keep
    assert not list((sft / "checkpoints" / "learner").glob("step-*"))
