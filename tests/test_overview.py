"""What `sarl status` shows: its glance at training (rl/run/overview.py), on
a run folder whose learner state the test writes (no job runs), and how it
names a submission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import sarl, write_config
from learner_runs import learner_config


def test_only_a_running_learner_is_given_an_eta(workdir: Path, tiny_model: Path) -> None:
    """A cancelled run showed `step 1/24 (196 s/step, ETA 75 min)`: an end
    that will never come. The pace stays (it is history); the ETA is given
    only while the learner's task runs."""
    from rl.config import load_config
    from rl.fsio import atomic_write
    from rl.run.overview import overview, render_overview
    from rl.run.rundir import RunDir
    from rl.run.status import run_status

    cfg = load_config(write_config(workdir, learner_config(tiny_model, 24)))
    rd = RunDir(workdir / "runs" / "l")
    rd.create(cfg)
    atomic_write(rd.state_path("learner", 0), json.dumps({"step": 1, "pace_s": 196.0}))

    running = overview(rd, cfg, learner_running=True)
    assert running["learner"]["eta_s"] == pytest.approx(196.0 * 23)
    assert "step 1/24 (196 s/step, ETA 75 min)" in render_overview(running)[0]
    stopped = overview(rd, cfg, learner_running=False)
    assert stopped["learner"]["eta_s"] is None
    assert "step 1/24 (196 s/step), published" in render_overview(stopped)[0]

    # never submitted: its learner runs nowhere, and status says no ETA
    st = run_status(rd, store=False, disk=False)
    assert st["roles"]["learner"]["counts"]["running"] == 0 and st["training"]["learner"]["eta_s"] is None
    text = sarl("status", str(rd.path), cwd=workdir, check=False).stdout
    assert "step 1/24 (196 s/step), published" in text and "ETA" not in text


def test_a_local_submission_lists_its_pids_not_a_range() -> None:
    """`local pids 7325..7342` read as 18 processes for a 2-task array."""
    from rl.run.executors import submission_label

    def label(ids: list[str]) -> str:
        return submission_label({"executor": "local", "job_ids": ids})

    assert label(["7325"]) == "local pid 7325"
    assert label(["7325", "7342"]) == "local pids 7325, 7342"
    assert label([str(p) for p in range(100, 106)]) == "local pids 100, 101, 102, 103 and 2 more"
    assert submission_label({"executor": "slurm", "job_id": "4713", "job_ids": ["4713_0"]}) == "4713"
