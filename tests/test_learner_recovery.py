"""The learner through faults: SIGKILLs (resumed bit-exact), a checkpoint that
cannot be loaded, steps redone after a publish, a step that is not finite, and
USR2 (preemption). The model and rollouts are those of test_learner.py."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import sarl, task_state, wait_for, write_config
from learner_runs import (
    commit_rollouts,
    learner_config,
    learner_pid,
    learner_state,
    published_weights,
    rollout_batches,
    start_learner,
)

from rl.store import Store


@pytest.mark.slow
@pytest.mark.parametrize("learner", [{}, {"lora": {"rank": 4}}], ids=["full", "lora"])
def test_a_learner_killed_three_times_ends_bit_exact(workdir: Path, tiny_model: Path, learner: dict) -> None:
    """Full fine-tuning, and LoRA (whose checkpoints hold the adapters and
    their moments, the frozen base read again from the model)."""
    steps = 6
    straight = start_learner(
        workdir, "straight", tiny_model, steps, learner
    )  # side by side: the result is not timing's
    # the killed run is fed the same batches (one a step), in the same order, one step ahead of
    # each kill point: it may be inside that step when killed, never past it (a fast machine ran
    # the rest of the steps within the random delay before a kill)
    killed = start_learner(workdir, "killed", tiny_model, steps, learner, groups=0)
    batches = rollout_batches(tiny_model, groups=2 * steps)
    writer = Store(killed / "store.zarr").writer("rollout-000000")

    def feed(upto: int) -> None:
        while writer.next_seq() < upto:
            writer.write(writer.next_seq(), batches[writer.next_seq()])

    rng = random.Random(5)
    kills = 0
    try:
        for point in sorted(rng.sample(range(1, steps - 1), 3)):  # after these steps, at a random instant
            feed(point + 1)
            # the step reached, by a live process (the state of a killed one may show it already)
            wait_for(
                lambda p=point: learner_state(killed).get("step", 0) >= p and learner_pid(killed), 300, f"step {point}"
            )
            time.sleep(rng.uniform(0.0, 0.8))
            pid = learner_pid(killed)
            assert pid is not None and not learner_state(killed).get("done"), "the learner finished before its kills"
            os.kill(pid, signal.SIGKILL)
            kills += 1
            wait_for(lambda: learner_pid(killed) is None, 30, "the learner to die")
            sarl("resume", str(killed), cwd=killed.parents[1])
            wait_for(lambda k=kills: len(learner_state(killed).get("starts", [])) == k + 1, 300, "the resumed learner")
        assert kills == 3
        feed(steps)
        wait_for(lambda: learner_state(killed).get("done"), 600, "the resumed learner")
        wait_for(lambda: learner_state(straight).get("done"), 600, "the uninterrupted learner")
        a, b = published_weights(straight, steps), published_weights(killed, steps)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)  # bit-exact
        from rl.learner.checkpoints import LearnerCheckpoints

        ca, cb = LearnerCheckpoints(straight).latest(), LearnerCheckpoints(killed).latest()
        assert ca is not None and cb is not None
        assert ca.cursor.to_json() == cb.cursor.to_json() and ca.meta["history"] == cb.meta["history"]
        applied = Counter(k for _, keys in cb.meta["history"] for k in keys)
        assert set(applied.values()) == {1} and len(applied) == steps  # every batch once
        assert len(task_state(killed, 0, "learner")["starts"]) == kills + 1
    finally:
        for run in (straight, killed):
            sarl("cancel", str(run), cwd=run.parents[1], check=False)


@pytest.mark.slow
@pytest.mark.parametrize(("ranks", "damage"), [(1, "truncated"), (2, "flipped")])
def test_a_checkpoint_that_cannot_be_loaded_is_set_aside_and_the_one_before_it_resumes(
    workdir: Path, tiny_model: Path, ranks: int, damage: str
) -> None:
    """The newest checkpoint's DeepSpeed files damaged while the learner is
    down: truncated (torn writes), or bytes flipped at the same size (which
    a load would not notice). The resumed learner, of one rank or two, finds
    it against the checkpoint's manifest, sets it aside with its reason,
    loads the one before, redoes the step after it on the same batch, and
    every batch is applied once."""
    steps = 4
    run = start_learner(
        workdir, "c", tiny_model, steps, groups=0, ranks=ranks
    )  # a checkpoint every step, the last 2 kept
    batches = rollout_batches(tiny_model, groups=2 * steps)
    writer = Store(run / "store.zarr").writer("rollout-000000")
    try:
        for b in batches[:2]:
            writer.write(writer.next_seq(), b)
        wait_for(lambda: learner_state(run).get("step", 0) >= 2 and learner_pid(run), 300, "step 2")
        newest = run / "checkpoints" / "learner" / "step-0000000002"
        wait_for(lambda: (newest / "meta.json").exists(), 60, "the checkpoint of step 2")
        pid = learner_pid(run)
        assert pid is not None
        if ranks == 1:
            os.kill(pid, signal.SIGKILL)
        else:  # every rank of the task goes down at once (rank 1 alone would wait in a collective)
            sarl("cancel", str(run), cwd=run.parents[1])
        wait_for(lambda: learner_pid(run) is None, 30, "the learner to die")
        payload = [p for p in newest.rglob("*.pt") if p.is_file()]
        assert payload, sorted(newest.rglob("*"))
        for p in payload:
            data = bytearray(p.read_bytes())
            if damage == "truncated":  # torn writes of a dying filesystem
                del data[len(data) // 2 :]
            else:  # bit rot: 64 bytes inverted in the middle, the size unchanged
                mid = len(data) // 2
                data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
            p.write_bytes(bytes(data))
        sarl("resume", str(run), cwd=run.parents[1])
        for b in batches[2:steps]:
            writer.write(writer.next_seq(), b)
        wait_for(lambda: learner_state(run).get("done"), 600, "the resumed learner")
        state = learner_state(run)
        assert list(state["checkpoints_set_aside"]) == ["bad-step-0000000002"], state.get("checkpoints_set_aside")
        why = state["checkpoints_set_aside"]["bad-step-0000000002"]
        assert "step 2: cannot be loaded" in why
        assert ("bytes" if damage == "truncated" else "its content changed") in why, why
        assert (run / "checkpoints" / "learner" / "bad-step-0000000002" / "why.txt").exists()
        from rl.learner.checkpoints import LearnerCheckpoints

        ck = LearnerCheckpoints(run).latest()
        assert ck is not None and ck.step == steps
        assert [s for s, _ in ck.meta["history"]] == [1, 2, 3, 4]
        applied = Counter(k for _, keys in ck.meta["history"] for k in keys)
        assert set(applied.values()) == {1} and len(applied) == steps  # step 2 redone on its batch, once
    finally:
        sarl("cancel", str(run), cwd=run.parents[1], check=False)


@pytest.mark.slow
def test_a_learner_killed_after_publishing_past_its_checkpoint_redoes_those_steps_without_publishing(
    workdir: Path, tiny_model: Path
) -> None:
    """Checkpoints every 3 steps, one version kept: killed at step 5, the
    learner resumes at 3 and redoes 4 and 5, whose versions a predecessor
    published (and pruned). It publishes nothing older than the newest, and
    goes on to publish 6."""
    steps = 6
    run = start_learner(workdir, "p", tiny_model, steps, learner={"checkpoint_every": 3, "keep_versions": 1}, groups=0)
    batches = rollout_batches(tiny_model, groups=2 * steps)
    writer = Store(run / "store.zarr").writer("rollout-000000")
    store = Store(run / "store.zarr")
    try:
        for b in batches[:5]:
            writer.write(writer.next_seq(), b)
        wait_for(lambda: learner_state(run).get("step", 0) >= 5 and learner_pid(run), 300, "step 5")
        wait_for(lambda: store.weights.latest() == 5, 60, "version 5")
        pid = learner_pid(run)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: learner_pid(run) is None, 30, "the learner to die")
        assert store.weights.versions() == [5]  # 1-4 pruned
        sarl("resume", str(run), cwd=run.parents[1])
        writer.write(writer.next_seq(), batches[5])
        wait_for(lambda: learner_state(run).get("done"), 600, "the resumed learner")
        state = learner_state(run)
        assert len(state["starts"]) == 2 and state["step"] == steps, state
        assert store.weights.versions() == [6]
        from rl.learner.checkpoints import LearnerCheckpoints

        ck = LearnerCheckpoints(run).latest()
        assert ck is not None and [s for s, _ in ck.meta["history"]] == list(range(1, steps + 1))
        applied = Counter(k for _, keys in ck.meta["history"] for k in keys)
        assert set(applied.values()) == {1} and len(applied) == steps
    finally:
        sarl("cancel", str(run), cwd=run.parents[1], check=False)


@pytest.mark.slow
def test_a_step_that_is_not_finite_is_not_applied_and_its_batch_is_quarantined(workdir: Path, tiny_model: Path) -> None:
    folder = workdir / "nan"
    folder.mkdir()
    run = folder / "runs" / "l"
    sarl("submit", str(write_config(folder, learner_config(tiny_model, steps=3))), cwd=folder)
    commit_rollouts(run, tiny_model, groups=4)  # 2 batches: steps 1 and 2
    store = Store(run / "store.zarr")
    # a generator bug: a copy of batch 0 with a NaN behaviour log-prob, committed third
    bad = store.reader().read(("rollout-000000", 0)).samples()
    bad[0].logprobs = bad[0].logprobs.copy()
    bad[0].logprobs[np.flatnonzero(bad[0].loss_mask)[0]] = np.nan
    store.writer("rollout-bad").write(0, bad)
    try:
        wait_for(lambda: learner_state(run).get("quarantined"), 400, "the bad batch to be quarantined")
        assert learner_state(run).get("step") == 2  # rolled back: still at the last good step
        good = store.reader().read(("rollout-000000", 1)).samples()
        store.writer("rollout-000000").write(2, good)  # a sound batch for step 3
        wait_for(lambda: learner_state(run).get("done"), 400, "the learner to finish")
        state = learner_state(run)
        assert list(state["quarantined"]) == ["rollout-bad/0"], state["quarantined"]
        assert "not finite" in state["quarantined"]["rollout-bad/0"]
        assert state["step"] == 3
        w = published_weights(run, 3)
        assert all(np.isfinite(v).all() for v in w.values())
    finally:
        sarl("cancel", str(run), cwd=folder, check=False)


def test_a_usr2_inside_a_held_section_is_answered_when_it_ends() -> None:
    """The learner's step changes the weights before it is counted, and the
    handler (save, requeue, exit) cannot wait for it on the thread it
    interrupts: a USR2 inside the step is answered once, right after it,
    by the handler installed before; one outside is answered at once."""
    from rl.context import usr2_held

    got: list[str] = []
    stage = ["before"]
    before = signal.signal(signal.SIGUSR2, lambda *_: got.append(stage[0]))
    try:
        with usr2_held():
            stage[0] = "inside"
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)
            assert got == []
            stage[0] = "after"
        assert got == ["after"]  # once, when the section ended
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        assert got == ["after", "after"]  # outside: at once
        assert signal.getsignal(signal.SIGUSR2) is not None and len(got) == 2
    finally:
        signal.signal(signal.SIGUSR2, before)


@pytest.mark.slow
def test_usr2_saves_the_last_step_at_once_and_the_requeued_learner_goes_on(workdir: Path, tiny_model: Path) -> None:
    run = start_learner(
        workdir, "usr2", tiny_model, steps=8, learner={"checkpoint_every": 100}
    )  # only USR2 and the end
    try:
        wait_for(lambda: learner_state(run).get("step", 0) >= 3, 300, "step 3")
        pid = learner_pid(run)
        assert pid is not None
        os.kill(pid, signal.SIGUSR2)
        wait_for(lambda: learner_state(run).get("checkpoints", 0) >= 1, 60, "the checkpoint on USR2")
        from rl.learner.checkpoints import LearnerCheckpoints

        saved = LearnerCheckpoints(run).latest()
        assert saved is not None and saved.step >= 3  # saved then, not at a periodic boundary (every 100)
        wait_for(lambda: learner_state(run).get("done"), 300, "the requeued learner")
        state = learner_state(run)
        assert state["step"] == 8 and len(state["starts"]) == 2 and state["batches"] == 8
    finally:
        sarl("cancel", str(run), cwd=run.parents[1], check=False)
