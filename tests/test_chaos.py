"""`sarl chaos` on the real local Slurm: a whole run of the tiny Llama (HF
engine, DeepSpeed learner, bubblewrap sandboxes), harmed once by each kind
of fault, then checked from its store and run directory. The CI run is this
short one (6 faults, one of each kind); the 20-fault run is the benchmark
(docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_config, sarl, write_config

from rl.tasks.format import write_tasks
from rl.tasks.synthesis import synthesize


def _config(tiny_model: Path, tasks_file: Path, steps: int, learner: bool = True) -> str:
    return run_config(
        "c",
        run={"mode": "async", "max_staleness": 1},
        model={"path": tiny_model, "dtype": "float32"},
        generator={"poll_s": 0.2, "engine": {"type": "hf", "max_model_len": 1024, "threads": 1}},
        rollout={
            "workers": 2,
            "tasks_file": tasks_file,
            "groups": 2 * steps,
            "group_size": 2,
            "groups_per_step": 2,
            "concurrency": 2,
            "batch_groups": 1,
            "agent": {"max_turns": 1, "max_tokens": 8},
        },
        learner={
            "steps": steps,
            "samples_per_step": 4,
            "poll_s": 0.2,
            "threads": 1,
            "checkpoint_every": 3,
            "job": {"mem_gb": 4},
        }
        if learner
        else None,
    )


def test_tensorboard_steps_that_go_back_are_found_and_a_purge_is_honoured(tmp_path: Path) -> None:
    import time

    from torch.utils.tensorboard import SummaryWriter

    from rl.chaos.invariants import tensorboard_backwards

    def write(folder: str, steps: list[int], purge: int | None = None) -> None:
        w = SummaryWriter(str(tmp_path / folder), purge_step=purge)
        for s in steps:
            w.add_scalar("x", float(s), s)
        w.close()

    write("restarted", [1, 2, 3, 4])
    time.sleep(1.1)  # event files are ordered by the second they were created in
    write("restarted", [2, 3])  # a restarted writer that starts over
    write("purged", [1, 2, 3, 4])
    time.sleep(1.1)
    write("purged", [3, 4, 5], purge=3)  # resumed at step 2: TensorBoard drops 3 and 4 of the first
    found = tensorboard_backwards(tmp_path)
    assert found == ["tb/restarted x: step 2 after step 4", "tb/restarted x: step 3 after step 4"], found


def test_a_learner_restarted_before_its_first_checkpoint_purges_what_its_predecessor_drew(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The learner's TensorBoard writer, opened by a learner that starts
    from nothing (no checkpoint: step 0) after a predecessor drew steps 1-3,
    drops those: its curves do not go back (sarl chaos found "step 1 after
    step 3" when only resumed learners purged)."""
    import time

    from rl.chaos.invariants import tensorboard_backwards
    from rl.config import validate_config
    from rl.learner.training import Training
    from rl.run.role import context_of

    raw = {"run": {"name": "t", "root": str(tmp_path)}, "model": {"path": str(tiny_model)}, "learner": {}}
    cfg = validate_config(raw, "test", cluster="local", base_dir=tmp_path)
    (cfg.run_dir / "tb").mkdir(parents=True)
    for steps in ([1, 2, 3], [1, 2]):  # the predecessor, killed at step 3; its successor, from step 0
        training = Training(context_of(cfg, cfg.run_dir), cfg.learner)
        assert training.step == 0
        tb = training._tb()
        for s in steps:
            tb.add_scalar("learner/loss", float(s), s)
        tb.close()
        time.sleep(1.1)  # event files are ordered by the second they were created in
    assert tensorboard_backwards(cfg.run_dir / "tb") == []


def test_chaos_refuses_a_run_without_every_role_and_a_negative_count_and_leaves_nothing(
    workdir: Path, tiny_model: Path
) -> None:
    tasks = workdir / "tasks.jsonl"
    write_tasks(tasks, synthesize("arithmetic", 4, seed=3))
    body = _config(tiny_model, tasks, steps=2)
    cfg = write_config(workdir, _config(tiny_model, tasks, steps=2, learner=False), "partial.toml")
    out = sarl("chaos", str(cfg), "--dir", "w", cwd=workdir, check=False)
    assert out.returncode != 0 and "add the missing sections: learner" in out.stderr, out.stderr
    out = sarl("chaos", str(write_config(workdir, body)), "--injections", "-1", "--dir", "w", cwd=workdir, check=False)
    assert out.returncode != 0 and "--injections -1" in out.stderr, out.stderr
    assert not (workdir / "w").exists()


@pytest.mark.slow
@pytest.mark.slurm
def test_chaos_injects_every_kind_of_fault_and_nothing_is_lost_or_done_twice(
    workdir: Path, tiny_model: Path, slurm: None
) -> None:
    tasks = workdir / "tasks.jsonl"
    write_tasks(tasks, synthesize("arithmetic", 10, seed=3))
    cfg = write_config(workdir, _config(tiny_model, tasks, steps=40))
    out = sarl("chaos", str(cfg), "--injections", "6", "--seed", "1", "--gap", "1", "3", "--dir", "w", "--json",
               cwd=workdir, check=False, timeout=2400)  # fmt: skip
    assert out.returncode in (0, 1), out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["injections"] == 6, (r["skipped"], r["faults"])
    assert set(r["kinds"]) == {"sigkill", "scancel", "preempt", "sigstop", "sandbox", "slurmd"}, r["kinds"]
    assert r["problems"] == [] and r["unhealed"] == [], r
    assert r["lost"] == 0 and r["duplicated"] == 0, r
    assert r["ok"] and out.returncode == 0
    # all 40 steps, or fewer where groups dropped for staleness left the last ones short, said so
    assert r["steps_applied"] == 40 or (r["steps_applied"] >= 30 and "every batch is consumed" in r["learner_ended"])
    assert r["episodes_committed"] + 2 * len(r["groups_abandoned"]) == 160
    assert all(f["recovery_s"] is not None and f["recovery_s"] >= 0 for f in r["faults"])
    assert r["recovery_max_s"] < 300 and r["throughput_ratio"] > 0

    run = workdir / "w" / "runs" / "chaos"
    # the evidence of the faults is in the run directory, not only in chaos's account of them
    deaths = [d for p in (run / "recovery").glob("*/task-*.json") for d in json.loads(p.read_text())["deaths"]]
    assert len(deaths) >= 2, deaths  # the SIGKILLed and the scancelled task (and the hung generator's cancel)
    states = [json.loads(p.read_text()) for p in (run / "checkpoints").glob("*/task-*.json")]
    assert any(s.get("checkpoints", 0) >= 1 for s in states)  # the preempted tasks checkpointed on USR2

    # the checker finds a batch consumed twice
    from rl.chaos.invariants import check
    from rl.learner.checkpoints import LearnerCheckpoints

    ck = LearnerCheckpoints(run).latest()
    assert ck is not None
    meta = json.loads((ck.path / "meta.json").read_text())
    meta["history"][-1][1].append(meta["history"][0][1][0])
    (ck.path / "meta.json").write_text(json.dumps(meta))
    v = check(run)
    assert v.batches_duplicated == 1 and any("repeats" in p for p in v.problems), v
