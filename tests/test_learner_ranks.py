"""The learner on several ranks: DeepSpeed's ZeRO stages take the step one rank
takes, ranks meet through the run directory, on Slurm and locally. The model
and rollouts are those of test_learner.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import sarl, wait_for, write_config
from learner_runs import close_enough, commit_rollouts, learner_config, learner_state, published_weights, start_learner

from rl.store import Store


@pytest.mark.slurm
@pytest.mark.slow
def test_two_ranks_on_slurm_train_the_weights_that_one_rank_does(workdir: Path, tiny_model: Path, slurm: None) -> None:
    """World size 2 (srun, 2 tasks, gloo, master from Slurm's node list)
    against world size 1 on the same committed data: the same weights to
    float32 summation order (each rank sums its micro-batch's gradient, and
    the all-reduce adds the two)."""
    steps = 3
    one = start_learner(workdir, "one", tiny_model, steps)
    two = start_learner(workdir, "two", tiny_model, steps, cluster="slurm", ranks=2)
    try:
        for run in (one, two):
            wait_for(lambda run=run: learner_state(run).get("done"), 600, f"the learner of {run.parent.parent.name}")
        from rl.learner.checkpoints import LearnerCheckpoints

        ca, cb = LearnerCheckpoints(one).latest(), LearnerCheckpoints(two).latest()
        assert ca is not None and cb is not None and ca.meta["ranks"] == 1 and cb.meta["ranks"] == 2
        assert ca.meta["history"] == cb.meta["history"]  # the same batches, step by step
        a, b = published_weights(one, steps), published_weights(two, steps)
        worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
        changed = max(float(np.abs(a[k] - published_weights(one, 1)[k]).max()) for k in a)
        print(f"largest difference between 1 and 2 ranks: {worst:.2e} (largest change in training: {changed:.2e})")
        assert worst <= 1e-5 and changed > 1e-3  # they trained, and to the same weights
        logs = list((two / "logs" / "learner").rglob("*_1_log.err"))
        assert logs, "no log of rank 1"
    finally:
        for run in (one, two):
            sarl("cancel", str(run), cwd=run.parents[1], check=False)


@pytest.mark.slow
def test_every_zero_stage_takes_the_same_step_skips_an_infinite_gradient_and_resumes(
    tiny_model: Path, tmp_path: Path
) -> None:
    """ZeRO 0-3 on one rank, from the same weights on the same samples
    (tests/zero_worker.py, the learner's Trainer in a process of its own).
    Stages 1 and 2 give stage 0's weights to the bit. Stage 3 gives them
    but for a handful of elements: its gradients are summed in another
    order, and Adam's first step, g / (|g| + eps), magnifies that where a
    gradient is near 0. A gradient that a hook makes infinite (the loss
    stays finite) is not applied at any stage: under ZeRO 1-3 p.grad is
    empty, and DeepSpeed's own skip is what the learner reads. A fresh
    Trainer loaded from the checkpoint of step 1 takes step 2 to the same
    weights."""
    worker = Path(__file__).with_name("zero_worker.py")
    cmd = [sys.executable, str(worker), str(tiny_model), str(tmp_path), "0", "1", "2", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rows = [json.loads(x[5:]) for x in proc.stdout.splitlines() if x.startswith("ZERO ")]
    assert proc.returncode == 0 and [r["stage"] for r in rows] == [0, 1, 2, 3], proc.stderr[-3000:]
    for r in rows:
        assert r["trained"] and r["resume_same"], r
        assert not r["inf_applied"] and not r["inf_changed"], r
    base = np.load(rows[0]["step1"])
    for r in rows[1:]:
        other = np.load(r["step1"])
        assert sorted(other.files) == sorted(base.files)
        diff = np.concatenate([np.abs(base[k] - other[k]).ravel() for k in base.files])
        if r["stage"] < 3:
            assert diff.max() == 0.0, (r["stage"], diff.max())
        else:  # lr 1e-3 moves a weight by up to 1e-3; a wrong gather would be off by the weights' size (~0.02)
            assert close_enough(diff), (diff.max(), int((diff > 1e-6).sum()))


@pytest.mark.slow
def test_zero3_on_two_ranks_publishes_every_version_with_the_weights_of_one_rank(
    workdir: Path, tiny_model: Path
) -> None:
    """ZeRO-3 partitions every weight over the ranks: each published version
    must be gathered whole. Two local ranks against one rank of ZeRO 0 on
    the same committed data, to the tolerance of `_close`."""
    steps = 3
    one = start_learner(workdir, "one", tiny_model, steps)
    z3 = start_learner(workdir, "z3", tiny_model, steps, learner={"zero_stage": 3}, ranks=2)
    try:
        for run in (one, z3):
            wait_for(lambda run=run: learner_state(run).get("done"), 600, f"the learner of {run.parent.parent.name}")
        assert Store(z3 / "store.zarr").weights.versions() == [1, 2, 3]  # the base model is version 0
        from rl.learner.checkpoints import LearnerCheckpoints

        cz = LearnerCheckpoints(z3).latest()
        assert cz is not None and cz.meta["ranks"] == 2
        for v in (1, steps):
            a, b = published_weights(one, v), published_weights(z3, v)
            assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)  # whole, not partitions
            diff = np.concatenate([np.abs(a[k] - b[k]).ravel() for k in a])
            assert close_enough(diff), (v, diff.max(), int((diff > 1e-6).sum()))
        changed = max(float(np.abs(published_weights(one, steps)[k] - published_weights(one, 1)[k]).max()) for k in a)
        assert changed > 1e-3  # it trained between the versions compared
    finally:
        for run in (one, z3):
            sarl("cancel", str(run), cwd=run.parents[1], check=False)


@pytest.mark.slow
def test_two_ranks_meet_through_the_run_directory_though_the_port_a_job_would_choose_is_taken(
    workdir: Path, tiny_model: Path
) -> None:
    """submitit's guess at a master port (MASTER_PORT, or one derived from
    the job id) is taken by another socket: the ranks meet all the same,
    through the run directory, at the port rank 0 actually bound. The
    rollouts then come later than the collectives' timeout (30 s): the
    other rank, waiting in a broadcast, is kept alive by rank 0."""
    import socket

    taken = socket.create_server(("0.0.0.0", 0))
    port = taken.getsockname()[1]
    folder = workdir / "meet"
    folder.mkdir()
    cfg = write_config(folder, learner_config(tiny_model, 2, {"collective_timeout_s": 30}, ranks=2))
    run = folder / "runs" / "l"
    env = {**os.environ, "MASTER_PORT": str(port)}  # what submitit's environment takes the master port from
    try:
        sarl("submit", str(cfg), "--cluster", "local", cwd=folder, env=env)
        rendezvous = run / "checkpoints" / "learner" / "rendezvous"
        met = wait_for(lambda: sorted(rendezvous.glob("*.json")), 300, "rank 0's rendezvous record")
        wait_for(lambda: learner_state(run).get("starts"), 300, "the learner's start")
        time.sleep(45)  # rank 0 waits for rollouts past the collectives' timeout
        commit_rollouts(run, tiny_model, groups=4)
        wait_for(lambda: learner_state(run).get("done"), 300, "the learner of two ranks")
        assert learner_state(run)["step"] == 2
        record = json.loads(met[0].read_text())
        assert record["port"] != port and len(record["nonce"]) == 32
    finally:
        taken.close()
        sarl("cancel", str(run), cwd=folder, check=False)


def test_a_learner_start_builds_no_op_and_leaves_no_shared_memory_behind() -> None:
    """DeepSpeed's CPU shared-memory op is neither built nor loaded: its JIT
    load held a lock file in the environment for about a second at every
    start (a learner killed then made every later one wait forever), and its
    64 MiB workspace in /dev/shm outlived the process. The collectives work
    without it."""
    code = (
        "import json, os, torch, deepspeed.comm as dc\n"
        "from rl.learner.dist import init_distributed\n"
        "init_distributed()\n"
        "t = torch.ones(3); dc.all_reduce(t)\n"
        "addr, port = os.environ['MASTER_ADDR'], os.environ['MASTER_PORT']\n"
        "name = 'deepspeed_allreduce_buffer_%d_%s_%s_0' % (os.getuid(), addr, port)\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(json.dumps({'shm': os.path.exists('/dev/shm/' + name), 'op': 'shm_comm' in maps, 'sum': t.tolist()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"shm": False, "op": False, "sum": [1.0, 1.0, 1.0]}, seen
