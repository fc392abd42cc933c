"""`sarl report`'s figures from real TensorBoard event files: the control
drawn beside the run, and the agent's turn figures shared with `sarl eval`."""

from __future__ import annotations

from pathlib import Path

import pytest


def _write(folder: Path, tag: str, values: list[float], steps: list[int] | None = None) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(folder)) as tb:
        for step, v in zip(steps or range(1, len(values) + 1), values, strict=True):
            tb.add_scalar(tag, v, step)


def test_the_report_sets_the_control_beside_the_run_and_names_the_difference(tmp_path: Path) -> None:
    from rl.run.report import against_control, plots, read_curves

    run, control = tmp_path / "run" / "tb", tmp_path / "control" / "tb"
    # step 3 written twice (a step redone after a restart): the later value counts
    _write(run / "learner", "learner/reward_mean", [0.1, 0.2, 0.0, 0.3, 0.5, 0.6, 0.7], [1, 2, 3, 3, 4, 5, 6])
    _write(control / "learner", "learner/reward_mean", [0.1, 0.1, 0.2, 0.1, 0.1, 0.1])
    for name, values in (("rollout/crash_share", [0.5, 0.25]), ("rollout/turn_2_share", [0.4, 0.6])):
        _write(run / "rollout-000000", name, values)
    _write(run / "eval", "eval/pass@1", [0.1, 0.3], [0, 6])
    _write(control / "eval", "eval/pass@1", [0.1, 0.1], [0, 6])
    mine, theirs = read_curves(run), read_curves(control)
    (line,) = against_control(mine, theirs, last=5)
    # this run's last 5 steps: 0.2, 0.3, 0.5, 0.6, 0.7 (step 3's redo); the control's: 0.1, 0.2, 0.1, 0.1, 0.1
    assert "this run 0.460 (step 6)" in line and "control 0.120 (step 6)" in line and "+0.340" in line
    (missing,) = against_control(mine, {}, last=5)
    assert "the control has no learner step yet" in missing
    alone, beside = plots(mine), plots(mine, theirs)
    assert list(alone) == ["reward", "pass1", "failures", "throughput", "learning", "policy", "agent", "control"]
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" for png in beside.values())
    assert alone["control"] != beside["control"]  # the control's curve is drawn
    # held-out pass@1 per version, beside the training reward, and the control's beside this run's
    assert alone["pass1"] != beside["pass1"] and alone["pass1"] != plots({"eval": mine["eval"]})["pass1"]
    assert alone["agent"] != plots({})["agent"]  # the rollout worker's turn figures are drawn


@pytest.mark.parametrize(
    ("counts", "want"),
    [
        ((10, 2, 4, 1), {"crash_share": 0.2, "turn_2_share": 0.4, "turn_2_fix_rate": 0.25}),
        ((3, 0, 0, 0), {"crash_share": 0.0, "turn_2_share": 0.0, "turn_2_fix_rate": None}),  # no turn 2: no rate
    ],
)
def test_the_agents_turn_figures(counts: tuple[int, int, int, int], want: dict[str, float | None]) -> None:
    from rl.episodes.samples import agent_shares

    assert agent_shares(*counts) == want


def test_the_glance_counts_each_roles_tasks_in_words() -> None:
    from rl.run.report import glance

    counts = {"done": 1, "running": 0, "failed": 0}
    roles = {"learner": {"tasks": 1, "counts": counts}, "rollout": {"tasks": 4, "counts": {**counts, "running": 3}}}
    status = {"name": "r", "run_dir": "/x/r", "roles": roles}
    lines = glance(status, {})
    assert lines[0] == "run r (/x/r)"
    assert "learner: 1 task, 1 done, 0 running, 0 failed" in lines
    assert "rollout: 4 tasks, 1 done, 3 running, 0 failed" in lines
