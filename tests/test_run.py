"""The whole run: generators, rollout workers and the learner of one config,
submitted by one `sarl submit` to the real local Slurm, exchanging rollouts
and weights only through the store, in sync and in async mode. The policy
is the tiny Llama, so that the run takes a minute; its rewards are what
they are (the plumbing is under test here, learning in test_learner)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import run_config, sarl, task_state, wait_for, write_config

from rl.store import Store
from rl.tasks.format import write_tasks
from rl.tasks.synthesis import synthesize


def _config(tiny_model: Path, tasks_file: Path, mode: str, executor: str | None = None, **rollout: Any) -> str:
    """The three roles on the tiny model; `rollout`: keys over the rollout section's."""
    return run_config(
        "w",
        run={"mode": mode, "max_staleness": 1 if mode == "async" else None},
        executor={"type": executor} if executor else None,
        model={"path": tiny_model, "dtype": "float32"},
        generator={"poll_s": 0.2, "engine": {"type": "hf", "max_model_len": 1024, "threads": 1}},
        rollout={
            "tasks_file": tasks_file,
            "groups": 8,
            "group_size": 2,
            "groups_per_step": 2,
            "concurrency": 2,
            "batch_groups": 1,
            "agent": {"max_turns": 1, "max_tokens": 8},
            **rollout,
        },
        learner={"steps": 4, "samples_per_step": 4, "poll_s": 0.2, "threads": 1, "job": {"mem_gb": 4}},
    )


def _run_and_check(workdir: Path, tiny_model: Path, mode: str) -> None:
    folder = workdir / mode
    folder.mkdir()
    write_tasks(folder / "tasks.jsonl", synthesize("arithmetic", 6, seed=2))
    cfg = write_config(folder, _config(tiny_model, folder / "tasks.jsonl", mode))
    out = sarl("submit", str(cfg), "--cluster", "slurm", cwd=folder)
    submitted = {ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("Submitted")}
    assert {"generator", "rollout", "learner"} <= submitted  # one submit, three roles
    run = folder / "runs" / "w"

    def learner_done() -> bool:
        path = run / "checkpoints" / "learner" / "task-000000.json"
        return path.exists() and bool(task_state(run, 0, "learner").get("done"))

    try:
        wait_for(learner_done, 600, f"the {mode} learner's 4 steps")
        wait_for(lambda: task_state(run, 0, "generator").get("version") == 4, 300, "the generator on version 4")
        # the run ends by itself: the generator's work ends with the learner's and the rollout workers'
        wait_for(lambda: task_state(run, 0, "generator").get("done"), 300, "the generator to end")
        assert task_state(run, 0, "generator")["result"]["version"] == 4
        from rl.learner.checkpoints import LearnerCheckpoints

        ck = LearnerCheckpoints(run).latest()
        assert ck is not None and ck.step == 4
        store = Store(run / "store.zarr")
        reader = store.reader()
        committed = {f"{w}/{s}" for w, s in reader.committed()}
        consumed = Counter(k for _, keys in ck.meta["history"] for k in keys)
        assert set(consumed.values()) == {1} and set(consumed) == committed  # each batch once, none left
        assert store.weights.latest() == 4
        from rl.run.report import read_curves

        dropped = {st: v for _, st, v in read_curves(run / "tb")["learner"].get("learner/dropped_stale", [])}
        for step, keys in ck.meta["history"]:
            batches = [reader.read((k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1]))) for k in keys]
            versions = {s.policy_version for b in batches for s in b.samples()}
            if mode == "sync":
                assert versions == {step - 1}, (step, versions)  # step N + 1 trains on version N alone
            else:  # within max_staleness, or dropped (whole groups, counted): a consumed batch holds both
                stale = [v for v in versions if step - 1 - v > 1]
                assert all(step - 1 - v >= 0 for v in versions) and (not stale or dropped.get(step, 0) > 0), (
                    step,
                    versions,
                    dropped.get(step),
                )
    finally:
        sarl("cancel", str(run), cwd=folder, check=False)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_short_sync_run_and_a_short_async_run_of_all_three_roles_consume_every_batch_once(
    workdir: Path, tiny_model: Path, slurm: None
) -> None:
    """Both runs side by side (each mostly waits on its other roles)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(_run_and_check, workdir, tiny_model, mode) for mode in ("sync", "async")]:
            f.result()


@pytest.mark.slow
def test_a_learner_with_fewer_rollouts_than_its_steps_need_trains_what_came_and_the_run_ends(
    workdir: Path, tiny_model: Path
) -> None:
    """3 groups of 2 (6 samples) for a learner of 4 steps of 4: step 1 takes
    4 samples; once the rollout worker is done, the 2 left make a last,
    smaller step 2, and the learner ends, saying why, instead of waiting
    forever. Every batch is consumed once, and the generator ends with it."""
    folder = workdir / "short"
    folder.mkdir()
    write_tasks(folder / "tasks.jsonl", synthesize("arithmetic", 6, seed=2))
    cfg = write_config(folder, _config(tiny_model, folder / "tasks.jsonl", "async", executor="local", groups=3))
    sarl("submit", str(cfg), cwd=folder)
    run = folder / "runs" / "w"

    def done(role: str) -> bool:
        path = run / "checkpoints" / role / "task-000000.json"
        return path.exists() and bool(task_state(run, 0, role).get("done"))

    try:
        wait_for(lambda: done("learner"), 300, "the learner to end")
        state = task_state(run, 0, "learner")
        assert state["step"] == 2 and "the rollout workers are done" in state["ended"], state
        assert "ended early" in sarl("status", str(run), cwd=folder).stdout
        from rl.learner.checkpoints import LearnerCheckpoints

        ck = LearnerCheckpoints(run).latest()
        assert ck is not None and ck.step == 2
        committed = {f"{w}/{s}" for w, s in Store(run / "store.zarr").reader().committed()}
        consumed = Counter(k for _, keys in ck.meta["history"] for k in keys)
        assert set(consumed.values()) == {1} and set(consumed) == committed  # each batch once, none left
        wait_for(lambda: done("generator"), 120, "the generator to end with the learner")
    finally:
        sarl("cancel", str(run), cwd=folder, check=False)


def _dropping_run(workdir: Path, tiny_model: Path, mode: str) -> tuple[Path, Path]:
    """A local run whose every group is dropped: dynamic sampling keeps only
    groups whose rewards differ, and the tiny model's 8 random tokens pass
    nothing."""
    folder = workdir / f"dropping-{mode}"
    folder.mkdir()
    write_tasks(folder / "tasks.jsonl", synthesize("arithmetic", 6, seed=2))
    body = _config(tiny_model, folder / "tasks.jsonl", mode, executor="local", dynamic_sampling=True)
    sarl("submit", str(write_config(folder, body)), cwd=folder)
    return folder, folder / "runs" / "w"


def _ended(run: Path, role: str) -> bool:
    path = run / "checkpoints" / role / "task-000000.json"
    return path.exists() and bool(task_state(run, 0, role).get("done"))


@pytest.mark.slow
def test_runs_whose_groups_are_all_dropped_end_instead_of_waiting_for_them(workdir: Path, tiny_model: Path) -> None:
    """Every group given up (rl.store.given_up). Sync: each round is whole
    with no group, so each of the 4 steps is an empty one that publishes
    the same weights as the next round's version, and the run ends with
    version 4. Async: the gate lets a group start for each one given up, so
    all 8 are played (not the 4 that `max_staleness` = 1 allows at version
    0), and the learner, with no sample, ends when the workers are done.
    Before, both waited for samples that no worker would commit, until
    stall recovery."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        sync, async_ = pool.map(lambda m: _dropping_run(workdir, tiny_model, m), ("sync", "async"))
    runs = {"sync": sync, "async": async_}
    try:
        for mode, (_, run) in runs.items():
            wait_for(lambda run=run: _ended(run, "learner"), 600, f"the {mode} learner to end")
            wait_for(lambda run=run: _ended(run, "rollout"), 120, f"the {mode} rollout worker to end")
            store = Store(run / "store.zarr")
            abandoned = task_state(run, 0, "rollout")["abandoned"]
            assert store.given_up.groups() == {int(g) for g in abandoned} == set(range(8)), abandoned
            assert all(r.startswith("dynamic sampling") for r in abandoned.values())
            assert store.reader().committed() == []
        state = task_state(runs["sync"][1], 0, "learner")
        assert state["step"] == 4 and "ended" not in state and state["last_empty_step"] == 4, state
        assert Store(runs["sync"][1] / "store.zarr").weights.latest() == 4
        from rl.run.report import read_curves

        curves = read_curves(runs["sync"][1] / "tb")["learner"]
        assert [(st, v) for _, st, v in curves["learner/given_up_groups"]] == [(s, 2) for s in (1, 2, 3, 4)]
        state = task_state(runs["async"][1], 0, "learner")
        assert state.get("step", 0) == 0 and "the rollout workers are done" in state["ended"], state
        for mode, (_, run) in runs.items():
            wait_for(lambda run=run: _ended(run, "generator"), 120, f"the {mode} generator to end with the run")
    finally:
        for folder, run in runs.values():
            sarl("cancel", str(run), cwd=folder, check=False)
