"""The learner as a real job: DeepSpeed (gloo, CPU) trains on committed
rollout batches, each once, publishes weight versions, and resumes
bit-exact after SIGKILLs.

The policy is a small Llama with SmolLM2's tokenizer and architecture
(2 layers of width 64, random weights from a fixed seed), so that a step
takes a second here; the rollouts are HumanEval prompts with their
reference solutions as the sampled tokens. Both are real data and a real
model; only the size is chosen for the test."""

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

from rl.store import Sample, Store


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl.engine.config import ModelConfig
    from rl.model import checkpoint, load_tokenizer

    base = checkpoint(ModelConfig(dtype="float32"))
    cfg = AutoConfig.from_pretrained(base)
    cfg.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})
    cfg.update({"num_key_value_heads": 2, "head_dim": 16})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    out = tmp_path_factory.mktemp("tiny-smollm2")
    model.save_pretrained(out)
    load_tokenizer(base).save_pretrained(out)
    return out


def _commit_rollouts(run: Path, tiny_model: Path, groups: int, group_size: int = 2, per_batch: int = 2) -> None:
    """Committed batches as rollout workers write them: whole groups, the
    prompt masked, the reference as the sampled tokens."""
    from rl.model import chat_ids, load_tokenizer
    from rl.tasks.importers import import_humaneval

    tok = load_tokenizer(tiny_model)
    tasks = import_humaneval()
    store = Store(run / "store.zarr")
    writer = store.writer("rollout-000000")
    rng = np.random.default_rng(0)
    batch: list[Sample] = []
    for g in range(groups):
        t = tasks[g % len(tasks)]
        prompt = chat_ids(tok, [{"role": "user", "content": t.prompt}])[:96]
        reply = tok.encode(t.reference, add_special_tokens=False)[:48]
        for i in range(group_size):
            ids = np.array(prompt + reply, dtype=np.int32)
            mask = np.array([0] * len(prompt) + [1] * len(reply), dtype=np.uint8)
            logprobs = np.where(mask == 1, rng.uniform(-12, -9, len(ids)), 0.0).astype(np.float32)
            batch.append(Sample(t.task_id, g, 0, ids, mask, logprobs, reward=float(i % 2), episode_id=f"{g}/{i}"))
        if (g + 1) % per_batch == 0:
            writer.write(writer.next_seq(), batch)
            batch = []


def _config(tiny_model: Path, steps: int, extra: str = "") -> str:
    return f"""
[run]
name = "l"
root = "runs"
[executor]
type = "local"
[model]
path = "{tiny_model}"
dtype = "float32"
[learner]
steps = {steps}
samples_per_step = 4
micro_batches = 2
poll_s = 0.2
{extra}
[learner.optimizer]
lr = 1e-3
"""


def _state(run: Path) -> dict:
    try:
        return task_state(run, 0, "learner")
    except (FileNotFoundError, ValueError):
        return {}


def _weights(run: Path, version: int) -> dict[str, np.ndarray]:
    _, tensors = Store(run / "store.zarr").weights.load(version)
    return {k: np.asarray(v).copy() for k, v in tensors.items()}


def _start(workdir: Path, name: str, tiny_model: Path, steps: int, extra: str = "") -> Path:
    folder = workdir / name
    folder.mkdir()
    cfg = write_config(folder, _config(tiny_model, steps, extra))
    run = folder / "runs" / "l"
    # the run directory first (submit creates it), then the rollouts a learner waits for
    sarl("submit", str(cfg), cwd=folder)
    _commit_rollouts(run, tiny_model, groups=2 * steps)
    return run


@pytest.mark.slow
def test_learner_trains_each_batch_once_and_publishes_every_version(workdir: Path, tiny_model: Path) -> None:
    run = _start(workdir, "a", tiny_model, steps=3, extra="keep_versions = 2\n")
    try:
        wait_for(lambda: _state(run).get("done"), 400, "the learner to finish")
        state = task_state(run, 0, "learner")
        assert state["step"] == 3 and state["batches"] == 3 and state["quarantined"] == {}
        store = Store(run / "store.zarr")
        assert store.weights.versions() == [2, 3]  # published each step, the last 2 kept
        w2, w3 = _weights(run, 2), _weights(run, 3)
        assert set(w2) and any(not np.array_equal(w2[k], w3[k]) for k in w2)  # it trained
        assert np.isfinite(state["mismatch_kl"]) and state["mismatch_kl"] > 0.05  # behaviour log-probs differ
        from rl.learner.checkpoints import LearnerCheckpoints

        ck = LearnerCheckpoints(run).latest()
        assert ck is not None and ck.step == 3
        applied = [k for _, keys in ck.meta["history"] for k in keys]
        assert sorted(applied) == sorted(f"rollout-000000/{s}" for s in range(3))
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run / "tb" / "learner"), size_guidance={"scalars": 0})
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"learner/loss", "learner/mismatch_kl", "learner/grad_norm", "learner/reward_mean"} <= tags
        assert [e.step for e in acc.Scalars("learner/loss")] == [1, 2, 3]
    finally:
        sarl("cancel", str(run), cwd=run.parents[1], check=False)


def _learner_pid(run: Path) -> int | None:
    import json

    path = run / "heartbeats" / "learner" / "task-000000.json"
    try:
        pid = int(json.loads(path.read_text())["pid"])
    except (FileNotFoundError, ValueError, KeyError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


@pytest.mark.slow
def test_a_learner_killed_three_times_ends_bit_exact(workdir: Path, tiny_model: Path) -> None:
    steps = 10
    straight = _start(workdir, "straight", tiny_model, steps)
    wait_for(lambda: _state(straight).get("done"), 600, "the uninterrupted learner")
    killed = _start(workdir, "killed", tiny_model, steps)
    rng = random.Random(5)
    kills = 0
    try:
        for point in sorted(rng.sample(range(1, steps - 1), 3)):  # after these steps, at a random instant
            # the step reached, by a live process (the state of a killed one may show it already)
            wait_for(lambda p=point: _state(killed).get("step", 0) >= p and _learner_pid(killed), 300, f"step {point}")
            time.sleep(rng.uniform(0.0, 0.8))
            pid = _learner_pid(killed)
            assert pid is not None and not _state(killed).get("done"), "the learner finished before its kills"
            os.kill(pid, signal.SIGKILL)
            kills += 1
            wait_for(lambda: _learner_pid(killed) is None, 30, "the learner to die")
            sarl("resume", str(killed), cwd=killed.parents[1])
            wait_for(lambda k=kills: len(_state(killed).get("starts", [])) == k + 1, 120, "the resumed learner")
        assert kills == 3
        wait_for(lambda: _state(killed).get("done"), 600, "the resumed learner")
        a, b = _weights(straight, steps), _weights(killed, steps)
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
def test_a_step_that_is_not_finite_is_not_applied_and_its_batch_is_quarantined(workdir: Path, tiny_model: Path) -> None:
    folder = workdir / "nan"
    folder.mkdir()
    run = folder / "runs" / "l"
    sarl("submit", str(write_config(folder, _config(tiny_model, steps=3))), cwd=folder)
    _commit_rollouts(run, tiny_model, groups=4)  # 2 batches: steps 1 and 2
    store = Store(run / "store.zarr")
    # a generator bug: a copy of batch 0 with a NaN behaviour log-prob, committed third
    bad = store.reader().read(("rollout-000000", 0)).samples()
    bad[0].logprobs = bad[0].logprobs.copy()
    bad[0].logprobs[np.flatnonzero(bad[0].loss_mask)[0]] = np.nan
    store.writer("rollout-bad").write(0, bad)
    try:
        wait_for(lambda: _state(run).get("quarantined"), 400, "the bad batch to be quarantined")
        assert _state(run).get("step") == 2  # rolled back: still at the last good step
        good = store.reader().read(("rollout-000000", 1)).samples()
        store.writer("rollout-000000").write(2, good)  # a sound batch for step 3
        wait_for(lambda: _state(run).get("done"), 400, "the learner to finish")
        state = _state(run)
        assert list(state["quarantined"]) == ["rollout-bad/0"], state["quarantined"]
        assert "not finite" in state["quarantined"]["rollout-bad/0"]
        assert state["step"] == 3
        w = _weights(run, 3)
        assert all(np.isfinite(v).all() for v in w.values())
    finally:
        sarl("cancel", str(run), cwd=folder, check=False)


def test_a_step_takes_whole_groups_and_drops_stale_ones_counted(tmp_path: Path) -> None:
    from rl.learner.data import micro_batches, take_step
    from rl.store import Cursor

    store = Store(tmp_path)
    w = store.writer("rollout-000000")

    def group(g: int, version: int, n: int = 2, length: int = 5) -> list[Sample]:
        ids = np.arange(length, dtype=np.int32)
        mask = np.array([0] + [1] * (length - 1), dtype=np.uint8)
        return [Sample("t", g, version, ids, mask, np.zeros(length, np.float32), 1.0) for _ in range(n)]

    w.write(0, group(0, version=0) + group(1, version=3))
    w.write(1, group(2, version=2, length=9))
    got = take_step(store, Cursor(), 4, version=4, max_staleness=2, sync=False, poll_s=0.01, should_stop=lambda: True)
    assert got is not None and got.dropped_stale == 2  # group 0 is 4 versions behind: dropped whole
    assert sorted(s.group_id for s in got.samples) == [1, 1, 2, 2] and len(got.keys) == 2
    stop = lambda: True  # noqa: E731
    sync = take_step(store, Cursor(), 2, version=3, max_staleness=None, sync=True, poll_s=0.01, should_stop=stop)
    assert sync is None  # no batch holds version 3 alone: a sync step waits (here: stops)
    parts = micro_batches(got.samples, 2)
    assert sorted(sum(len(s.tokens) for s in p) for p in parts) == [14, 14]


@pytest.mark.slow
def test_usr2_saves_the_last_step_at_once_and_the_requeued_learner_goes_on(workdir: Path, tiny_model: Path) -> None:
    run = _start(workdir, "usr2", tiny_model, steps=8, extra="checkpoint_every = 100\n")  # only USR2 and the end
    try:
        wait_for(lambda: _state(run).get("step", 0) >= 3, 300, "step 3")
        pid = _learner_pid(run)
        assert pid is not None
        os.kill(pid, signal.SIGUSR2)
        wait_for(lambda: _state(run).get("checkpoints", 0) >= 1, 60, "the checkpoint on USR2")
        from rl.learner.checkpoints import LearnerCheckpoints

        saved = LearnerCheckpoints(run).latest()
        assert saved is not None and saved.step >= 3  # saved then, not at a periodic boundary (every 100)
        wait_for(lambda: _state(run).get("done"), 300, "the requeued learner")
        state = _state(run)
        assert state["step"] == 8 and len(state["starts"]) == 2 and state["batches"] == 8
    finally:
        sarl("cancel", str(run), cwd=run.parents[1], check=False)
