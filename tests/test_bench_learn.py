"""`sarl bench learn --quick`: the quickstart's chain end to end (tasks,
the leak check, the SFT warm start, export, RL from the export with all
three roles, the shuffled-reward control, evaluations of every stage), on
the tiny model so that it takes minutes.
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
    # the recipe under measurement: a warm start with repair traces, then agent RL of two turns
    out = sarl("bench", "learn", "--quick", "--json", "--dir", "w", "--model", str(tiny_model),
               "--sft-set", "learner.loss.repairs=0.5", "--rl-set", "rollout.agent.max_turns=2", cwd=workdir,
               timeout=1200)  # fmt: skip
    r = json.loads(out.stdout)
    assert r["max_turns"] == 2 and r["rl_set"] == ["rollout.agent.max_turns=2"]
    for key in ("", "humaneval_"):
        for stage in ("base", "sft", "rl", "control"):
            assert 0.0 <= r[f"{key}pass1_{stage}"] <= 1.0, (key, stage)
            assert 0.0 <= r[f"{key}crash_share_{stage}"] <= 1.0 and 0.0 <= r[f"{key}turn_2_share_{stage}"] <= 1.0
        for a, b in (("sft", "base"), ("rl", "sft"), ("rl", "control")):
            assert r[f"{key}gain_{a}_vs_{b}_se"] >= 0.0
            assert r[f"{key}gain_{a}_vs_{b}"] == pytest.approx(r[f"{key}pass1_{a}"] - r[f"{key}pass1_{b}"], abs=1e-3)
    assert r["tasks"] == 6 and r["humaneval_tasks"] == 6
    assert r["quick"] is True and r["minutes"] >= r["minutes_sft"] + r["minutes_rl"] + r["minutes_control"] > 0
    w = workdir / "w"
    sft, rl, control = (w / "runs" / n for n in ("quickstart-sft", "quickstart-rl", "quickstart-rl-control"))
    export = json.loads((sft / "model" / "sarl-export.json").read_text())
    assert export["version"] == 2 and export["run"] == str(sft)  # the warm start's last version
    assert "repairs = 0.5" in (sft / "run.toml").read_text()
    for run in (rl, control):
        frozen = (run / "run.toml").read_text()
        assert str(sft / "model") in frozen and 'mode = "sync"' in frozen  # RL started from the export
        assert "max_turns = 2" in frozen
    # every stage was evaluated as the RL run plays: up to 2 turns
    evals = [p.read_text().splitlines()[0] for p in (w / "logs").iterdir() if "-eval-" in p.name]
    assert len(evals) == 8 and all("--max-turns 2" in e for e in evals), evals
    assert "shuffle_rewards = true" in (control / "run.toml").read_text()
    # the RL run's report has the control's reward beside its own
    assert (rl / "report" / "control.png").is_file()
    assert "mean reward over the last 5 learner steps: this run" in (rl / "report" / "summary.txt").read_text()
    assert "shuffle_rewards = true" not in (rl / "run.toml").read_text()
    assert (w / "logs").is_dir() and any("leaks" in p.name for p in (w / "logs").iterdir())  # the leak check ran
    for run in (rl, control):
        state = json.loads((run / "checkpoints" / "learner" / "task-000000.json").read_text())
        assert state["done"] and state["step"] == 2
    # every role of the RL run ended by itself: the generator with the learner and the rollouts
    for role in ("generator", "rollout", "learner"):
        assert json.loads((rl / "checkpoints" / role / "task-000000.json").read_text())["done"], role
    # the evaluations' per-task results are in the runs
    assert (sft / "eval" / "v000000" / "gen.heldout" / "results.jsonl").is_file()
    assert not (sft / "store.zarr").exists()  # weights dropped at the end unless --keep
    assert not list((sft / "checkpoints" / "learner").glob("step-*"))
