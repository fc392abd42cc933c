"""Rollout workers: bad input refused before submission; every episode
committed exactly once, or its group abandoned with a reason, through
SIGKILLs and scancels on the real Slurm, a USR2 and a generator killed
mid-run (real generators, sandboxes, verifier and store)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import hf_worker, merged, run_config, sarl, status, task_state, wait_for, write_config

from rl.episodes.samples import POLICY_FAILURES
from rl.store import Store
from rl.tasks.format import write_tasks
from rl.tasks.importers import import_humaneval


@pytest.fixture
def tasks_file(workdir: Path) -> Path:
    path = workdir / "tasks.jsonl"
    write_tasks(path, import_humaneval()[:8])
    return path


GENERATOR = {"poll_s": 0.5, "engine": {"type": "hf", "max_model_len": 1024}}


def _config(
    tasks_file: Path | list[Any],
    generator: bool | dict[str, Any] = True,
    groups: int = 6,
    model: Path | None = None,
    run: dict[str, Any] | None = None,
    rollout: dict[str, Any] | None = None,
    recovery: bool | dict[str, Any] = False,  # most tests here watch the manual path (sarl resume)
    **sections: Any,
) -> str:
    """A rollout run without a learner. `model`: the tiny model for the tests
    whose subject is delivery, not the policy's answers; `run`, `rollout`:
    keys over their sections'; `sections`: other sections."""
    base = {"tasks_file": tasks_file, "groups": groups, "group_size": 2, "concurrency": 4}
    return run_config(
        "r",
        recovery=recovery,
        run=run or {},
        executor={"type": "local"},
        model={"dtype": "float32", "path": model},
        generator=merged(GENERATOR, generator if isinstance(generator, dict) else {}) if generator else None,
        rollout=merged({**base, "agent": {"max_turns": 1, "max_tokens": 24}}, rollout or {}),
        **sections,
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"generator": False}, "rollout workers need generators: add a [generator] section"),
        ({"rollout": {"x": {}}}, "rollout.x: unknown key"),
        ({"run": {"max_staleness": -1}}, "run.max_staleness"),
        ({"rollout": {"max_staleness": 2}}, "rollout.max_staleness: moved to run.max_staleness"),
        ({"bad_tasks": True}, "rollout.tasks_file"),
        ({"run": {"max_staleness": 2}}, "run.max_staleness needs rollout.groups_per_step"),
        ({"rollout": {"groups_per_step": 7}}, "groups_per_step = 7 is more than the 6 groups"),
        ({"run": {"mode": "sync"}}, "rollout.groups_per_step: run.mode = 'sync' plays one round"),
        ({"run": {"mode": "sync", "max_staleness": 1}}, "run.max_staleness = 1: run.mode = 'sync'"),
        (
            {"run": {"mode": "sync"}, "rollout": {"groups_per_step": 2}, "learner": {"samples_per_step": 6}},
            "learner.samples_per_step = 6 must equal rollout.groups_per_step x rollout.group_size = 2 x 2 = 4",
        ),
        (
            {
                "run": {"mode": "sync"},
                "rollout": {"groups_per_step": 2},
                "learner": {"samples_per_step": 4, "tokens_per_step": 64},
            },
            "learner.tokens_per_step = 64: run.mode = 'sync'",
        ),
        ({"rollout": {"file_weights": [1.0, 2.0]}}, "file_weights: 2 weights for 1 task files"),
        ({"second_file": True}, "is in both"),
        ({"learner": {"samples_per_step": 2, "micro_batches": 4}}, "micro_batches = 4 is more than"),
        (
            {
                "run": {"mode": "sync"},
                "rollout": {"groups_per_step": 2},
                "learner": {"samples_per_step": 4, "publish_every": 2},
            },
            "learner.publish_every = 2: run.mode = 'sync'",
        ),
    ],
)
def test_bad_rollout_input_is_refused_before_submission(
    workdir: Path, tasks_file: Path, change: dict, words: str
) -> None:
    if change.get("bad_tasks"):
        tasks_file.write_text('{"task_id": "t", "prompt": "x"}\n')
    files: Path | list[Any] = tasks_file
    if change.get("second_file"):  # the same tasks again: their ids collide
        (workdir / "more.jsonl").write_text(tasks_file.read_text())
        files = [tasks_file, "more.jsonl"]
    body = _config(
        files,
        generator=change.get("generator", True),
        run=change.get("run"),
        rollout=change.get("rollout"),
        learner=change.get("learner"),
    )
    out = sarl("submit", str(write_config(workdir, body)), cwd=workdir, check=False)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert not (workdir / "runs" / "r").exists()
    if change.get("bad_tasks"):
        assert "tasks.jsonl:1" in out.stderr  # names the line


def _ended(run: Path, task: int) -> str | None:
    """The rollout task's status once it is no longer alive."""
    st = next(t for t in status(run)["roles"]["rollout"]["detail"] if t["task"] == task)["status"]
    return st if st in ("FAILED", "CANCELLED", "DONE") else None


def _heartbeat(run: Path, role: str, task: int) -> dict:
    path = run / "heartbeats" / role / f"task-{task:06d}.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _episodes(store: Store) -> Counter[str]:
    reader = store.reader()
    out: Counter[str] = Counter()
    for key in reader.committed():
        out.update(reader.read(key).episode_ids)
    return out


def _assert_exactly_once(run: Path, store: Store, groups: int, group_size: int, workers: int = 1) -> set[int]:
    """Every episode identity of every group committed once, or its group abandoned; returns the abandoned."""
    episodes = _episodes(store)
    abandoned: set[int] = set()
    for w in range(workers):
        abandoned |= {int(g) for g in task_state(run, w, "rollout")["abandoned"]}
    want = {f"{g}/{i}" for g in range(groups) if g not in abandoned for i in range(group_size)}
    assert set(episodes) == want, (sorted(set(episodes) ^ want), abandoned)
    assert all(n == 1 for n in episodes.values()), [e for e, n in episodes.items() if n > 1]
    return abandoned


def _run_to_end(workdir: Path, run: Path, workers: int = 1, timeout: float = 600) -> None:
    wait_for(
        lambda: all(task_state(run, w, "rollout").get("done") for w in range(workers)), timeout, "the workers to finish"
    )


@pytest.mark.slow
def test_usr2_commits_the_complete_groups_then_requeues(workdir: Path, tasks_file: Path, tiny_model: Path) -> None:
    """One batch for the whole run (batch_groups = 100), unless a USR2 makes
    the worker commit early. The test decides when the USR2 lands, not the
    machine's speed: once a group is complete, the generator is stopped
    (SIGSTOP), so that no group completes and none is committed until the
    USR2 flushes the complete ones; then the generator goes on, and the
    requeued worker plays the rest."""
    cfg = write_config(
        workdir, _config(tasks_file, groups=30, model=tiny_model, rollout={"concurrency": 2, "batch_groups": 100})
    )
    sarl("submit", str(cfg), cwd=workdir)
    run = workdir / "runs" / "r"
    store = Store(run / "store.zarr")
    generator = None
    try:
        wait_for(lambda: _heartbeat(run, "rollout", 0).get("pending", 0) >= 1, 300, "a complete group")
        generator = _heartbeat(run, "generator", 0)["pid"]
        os.kill(generator, signal.SIGSTOP)  # from here no group completes: the complete ones wait for the flush
        assert not store.reader().committed(), "the whole run was played before the generator stopped"
        worker = _heartbeat(run, "rollout", 0)["pid"]
        os.kill(worker, signal.SIGUSR2)  # the task itself: submitit's local controller does not forward it
        wait_for(lambda: task_state(run, 0, "rollout").get("checkpoints", 0) >= 1, 60, "the checkpoint")
        flushed = wait_for(lambda: store.reader().committed(), 60, "the flushed batch")
        assert len(flushed) == 1, "USR2 committed nothing, or more than the complete groups"
        os.kill(generator, signal.SIGCONT)
        generator = None
        _run_to_end(workdir, run)
        _assert_exactly_once(run, store, groups=30, group_size=2)
        state = task_state(run, 0, "rollout")
        assert len(state["starts"]) == 2 and state["checkpoints"] == 1  # requeued once, by itself
        assert len(store.reader().committed()) == 2  # the flush, then the rest at the end
    finally:
        if generator is not None:
            os.kill(generator, signal.SIGCONT)
        sarl("cancel", str(run), cwd=workdir, check=False)


@pytest.mark.slow
def test_usr2_while_no_generator_is_left_requeues_at_once(workdir: Path, tasks_file: Path, tiny_model: Path) -> None:
    """The only generator killed (recovery off: none comes back), the worker's
    episodes wait for one (`generator_wait_s` is 1800 s). A USR2 ends those
    waits: the worker checkpoints and requeues within seconds, not after the
    30 s it gives its loop (a preempted job that holds on delays every job
    waiting for the node)."""
    body = _config(tasks_file, groups=30, model=tiny_model, rollout={"concurrency": 2})
    sarl("submit", str(write_config(workdir, body)), cwd=workdir)
    run = workdir / "runs" / "r"
    store = Store(run / "store.zarr")
    try:
        wait_for(lambda: store.reader().committed(), 300, "a first batch")
        generator = _heartbeat(run, "generator", 0)["pid"]
        os.kill(generator, signal.SIGKILL)
        wait_for(lambda: not _alive(generator), 30, "the generator to die")
        beat = wait_for(lambda: (b := _heartbeat(run, "rollout", 0)).get("inflight", 0) >= 1 and b, 60, "episodes")
        time.sleep(3)  # their requests fail, and the client waits for a generator
        assert task_state(run, 0, "rollout").get("checkpoints", 0) == 0
        sent = time.time()
        os.kill(beat["pid"], signal.SIGUSR2)
        wait_for(lambda: task_state(run, 0, "rollout").get("checkpoints", 0) >= 1, 60, "the checkpoint")
        took = time.time() - sent
        assert took < 10, f"USR2 to checkpoint took {took:.1f} s"
        assert len(task_state(run, 0, "rollout")["starts"]) >= 1
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)


@pytest.mark.slow
def test_a_generator_killed_mid_run_costs_retries_not_rewards(
    workdir: Path, tasks_file: Path, tiny_model: Path
) -> None:
    body = _config(tasks_file, groups=6, model=tiny_model, generator={"workers": 2})
    sarl("submit", str(write_config(workdir, body)), cwd=workdir)
    run = workdir / "runs" / "r"
    store = Store(run / "store.zarr")
    try:
        wait_for(lambda: len(store.reader().committed()) >= 1, 300, "a first batch")
        victim = _heartbeat(run, "generator", 1)["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not _alive(victim), 30, "the generator to die")
        _run_to_end(workdir, run)
        assert _assert_exactly_once(run, store, groups=6, group_size=2) == set()  # nothing abandoned
        reader = store.reader()
        failures = {f for key in reader.committed() for f in reader.read(key).failures}
        assert failures <= set(POLICY_FAILURES) | {""}, failures  # no infrastructure reason was scored
        state = task_state(run, 0, "rollout")
        assert state["generator_retries"] + state["retries"] >= 1, state  # the dead one was tried, and retried
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.slurm
def test_every_episode_is_committed_once_through_sigkills_and_scancels(
    workdir: Path, tasks_file: Path, slurm: None, tiny_model: Path
) -> None:
    groups, workers = 20, 2
    body = _config(tasks_file, groups=groups, model=tiny_model, rollout={"concurrency": 2, "workers": workers})
    sarl("submit", str(write_config(workdir, body)), "--cluster", "slurm", cwd=workdir)
    run = workdir / "runs" / "r"
    store = Store(run / "store.zarr")
    rng = random.Random(7)

    def beating() -> list[tuple[dict, dict]]:  # running workers, with a heartbeat from their current job
        detail = status(run)["roles"]["rollout"]["detail"]
        beats = [(t, _heartbeat(run, "rollout", t["task"])) for t in detail if t["status"] == "RUNNING"]
        return [(t, b) for t, b in beats if b.get("job_id") == t["job_id"] and "pid" in b]

    try:
        kills: list[str] = []
        for _ in range(8):  # SIGKILL, scancel, SIGKILL, each after one more batch, of a random live worker
            if len(kills) == 3:
                break
            n = len(kills)
            wait_for(lambda n=n: len(store.reader().committed()) >= n + 1, 300, f"{n + 1} batch(es)")
            # The generator is frozen from the choice of a victim until Slurm has seen the kill: the
            # tiny model plays a worker's last groups in seconds, and the victim must not end first.
            wait_for(beating, 120, "a running worker's heartbeat")
            generator = _heartbeat(run, "generator", 0)["pid"]
            os.kill(generator, signal.SIGSTOP)
            try:
                live = beating()
                if not live:  # the one left ended meanwhile
                    continue
                if n == 0:  # status tells per worker what is committed, in flight, failing, and the rate
                    assert all(
                        re.search(
                            r"\d+ episodes committed in \d+ batches, \d+ in flight, [\d.]+/s; failures: ",
                            t["progress"],
                        )
                        for t, _ in live
                    ), live
                victim, beat = rng.choice(live)
                if n % 2 == 0:
                    os.kill(beat["pid"], signal.SIGKILL)
                else:
                    subprocess.run(["scancel", victim["job_id"]], check=True)
                seen = wait_for(
                    lambda v=victim: _ended(run, v["task"]), 60, f"Slurm to see the kill of {victim['job_id']}"
                )
            finally:
                os.kill(generator, signal.SIGCONT)
            if not live or seen == "DONE":  # its last episodes were verified before the kill landed
                continue
            kills.append(f"{'kill' if n % 2 == 0 else 'scancel'} {victim['job_id']}")
            out = sarl("resume", str(run), cwd=workdir)
            assert f"rollout tasks {victim['task']}" in out.stderr, out.stderr
        assert len(kills) == 3, kills
        _run_to_end(workdir, run, workers)
        _assert_exactly_once(run, store, groups, group_size=2, workers=workers)
        assert sum(len(task_state(run, w, "rollout")["starts"]) for w in range(workers)) == workers + len(kills)
        batch = store.reader().read(store.reader().committed()[0]).samples()[0]
        assert batch.versions is not None and set(batch.versions[batch.loss_mask == 1]) == {0}

        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        for w in range(workers):
            acc = EventAccumulator(str(run / "tb" / f"rollout-{w:06d}"), size_guidance={"scalars": 0})
            acc.Reload()
            tags = set(acc.Tags()["scalars"])
            assert {"rollout/reward_mean", "rollout/episodes_per_s", "rollout/time/verify_s", "rollout/turns"} <= tags
            assert {"rollout/crash_share", "rollout/turn_2_share"} <= tags
            assert {e.value for e in acc.Scalars("rollout/turn_2_share")} == {0.0}  # max_turns = 1
            steps = [e.step for e in acc.Scalars("rollout/batches")]
            assert steps == sorted(steps) and steps[-1] == 2 * groups // workers  # steps never go back
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
        time.sleep(0.5)


@pytest.mark.slow
def test_sync_mode_generates_round_n_with_version_n_alone(workdir: Path, tasks_file: Path, tiny_model: Path) -> None:
    """The test publishes version 1 itself, as the learner would after round 0."""
    from safetensors.torch import load_file

    body = _config(tasks_file, groups=4, model=tiny_model, run={"mode": "sync"}, rollout={"groups_per_step": 2})
    sarl("submit", str(write_config(workdir, body)), cwd=workdir)
    run = workdir / "runs" / "r"
    store = Store(run / "store.zarr")
    try:
        wait_for(lambda: len(_episodes(store)) == 4, 300, "round 0 (groups 0 and 1) committed")
        time.sleep(5.0)  # a worker that ignored the round would start group 2 now
        state = task_state(run, 0, "rollout")
        assert set(state["planned"]) == {"0", "1"}, state["planned"]
        assert store.weights.latest() is None
        weights = load_file(str(tiny_model / "model.safetensors"))
        store.weights.publish(weights, version=1, dtype="float32")
        _run_to_end(workdir, run)
        _assert_exactly_once(run, store, groups=4, group_size=2)
        reader = store.reader()
        for key in reader.committed():
            for s in reader.read(key).samples():
                assert set(s.versions[s.loss_mask == 1].tolist()) == {s.group_id // 2}, (s.episode_id, s.versions)
        assert task_state(run, 0, "rollout")["abandoned"] == {}
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
        time.sleep(0.5)


@pytest.mark.slow
def test_bench_rollout_reports_both_concurrencies_and_the_time_shares(workdir: Path) -> None:
    """A short run of the benchmark (its figures are in docs/benchmarks.md) on
    workspace tasks, the kind with the most to report: every field it
    promises, each consistent with the others, and the cost of each tool.
    (The function kind runs the same loop without tools; a second run cost CI
    two minutes.)"""
    args = ("--groups", "1", "1", "--max-tokens", "12", "--env", "workspace")
    out = sarl("bench", "rollout", "--json", *args, cwd=workdir, timeout=600)
    r = json.loads(out.stdout)
    assert r["env"] == "workspace" and r["max_turns"] == 4
    tools = [r.get(f"tool_ms_{t}") for t in ("shell_tests", "shell_ls", "read_file", "write_file")]
    assert all(t is not None and 0 < t < 10_000 for t in tools), tools
    assert r["episodes_c1"] == r["episodes_alone"] == r["episodes"] == 4  # groups x 4, every one committed
    for key in ("", "_c1", "_alone"):
        assert r[f"episodes_per_s{key}"] > 0 and 0 <= r[f"generator_busy{key}"] <= 1
        shares = [r[f"{t}_share{key}"] for t in ("generate", "execute", "verify")]
        assert all(0 <= x <= 1.05 for x in shares) and r[f"generate_share{key}"] > r[f"verify_share{key}"]
    assert r["speedup"] == pytest.approx(r["episodes_per_s"] / r["episodes_per_s_c1"], rel=0.02)
    assert r["group_request_speedup"] == pytest.approx(r["episodes_per_s"] / r["episodes_per_s_alone"], rel=0.02)


@pytest.mark.slow
def test_a_late_generator_costs_waiting_not_deadlines_and_a_missing_one_abandons_in_time(
    tmp_path: Path, tasks_file: Path, tiny_model: Path
) -> None:
    """Generators may start long after the workers (queued, preempted, restarting). An episode
    waits up to `generator_wait_s` for one to announce itself, and that wait is not the policy's
    time: it does not count against `episode_deadline_s`. Past `generator_wait_s` the attempt is an
    infrastructure failure, retried, and then the group is abandoned with its reason."""
    import threading

    from rl.engine import make_engine
    from rl.rollout.loop import play
    from rl.rollout.worker import Worker
    from rl.serving.inprocess import serving

    def worker(name: str, wait_s: float, deadline_s: float) -> tuple[Worker, Any, dict]:
        rollout = {"groups": 1, "group_size": 2, "concurrency": 2, "max_retries": 1, "generator_wait_s": wait_s,
                   "episode_deadline_s": deadline_s, "agent": {"max_turns": 2, "max_tokens": 8}}  # fmt: skip
        return hf_worker(tmp_path, name, tasks_file, tiny_model, rollout)

    # no generator at all: each of the 2 attempts waits 1 s, then the group is abandoned, saying why
    none, _, state = worker("none", 1.0, 600.0)
    t0 = time.monotonic()
    play(none)
    assert time.monotonic() - t0 < 60
    assert list(state["abandoned"]) == ["0"] and state["abandoned"]["0"].startswith("no-generator"), state
    assert not none.store.reader().committed()

    # a generator that announces itself 8 s after the episodes start: they wait for it, and then
    # play both their turns, though their deadline is 5 s
    late, cfg, state = worker("late", 60.0, 5.0)
    engine = make_engine(cfg.generator.engine, cfg.model)
    thread = threading.Thread(target=play, args=(late,))
    thread.start()
    # the 8 s count from when both episodes wait, not from when the worker was started (its
    # set-up takes longer on a slower machine)
    wait_for(lambda: len(late.inflight) >= 2, 120, "both episodes waiting for a generator")
    time.sleep(8.0)
    try:
        with serving(engine, cfg.run_dir):
            thread.join(120)
    finally:
        engine.close()
    assert not thread.is_alive()
    assert not state.get("abandoned"), state["abandoned"]
    # the group's first replies are one request (rollout.group_request), which waited for the generator;
    # the other episode waited for that request, and its deadline moved by the same wait
    assert late.stats.generator_wait_s >= 6.0
    reader = late.store.reader()
    samples = [s for k in reader.committed() for s in reader.read(k).samples()]
    assert len(samples) == 2
    for s in samples:
        turns = int(np.sum(np.diff(np.concatenate([[0], s.loss_mask])) == 1))  # runs of sampled tokens
        assert turns == 2 and s.failure != "deadline", (s.episode_id, turns, s.failure)


@pytest.mark.slow
def test_a_groups_first_replies_are_one_request_with_n(tmp_path: Path, tasks_file: Path, tiny_model: Path) -> None:
    """`rollout.group_request`: the episodes of a group share their prompt, and
    their first replies are one request with n = group_size (the generator
    counts requests), episode i taking reply i; off, each episode asks alone.
    Both ways commit every episode once, and the group's request is seeded by
    the group: a second run of it samples the same replies."""
    from rl.engine import make_engine
    from rl.rollout.loop import play as play_groups
    from rl.serving.inprocess import serving

    def play(name: str, group_request: bool) -> tuple[int, dict[str, list[int]]]:
        rollout = {"groups": 2, "group_size": 3, "concurrency": 6, "group_request": group_request,
                   "agent": {"max_turns": 1, "max_tokens": 8, "temperature": 1.0}}  # fmt: skip
        worker, cfg, _ = hf_worker(tmp_path, name, tasks_file, tiny_model, rollout)
        engine = make_engine(cfg.generator.engine, cfg.model)
        try:
            with serving(engine, cfg.run_dir) as server:
                play_groups(worker)
                served = server.health()["served"]
        finally:
            engine.close()
        reader = worker.store.reader()
        samples = [s for k in reader.committed() for s in reader.read(k).samples()]
        return served, {s.episode_id: s.tokens[s.loss_mask == 1].tolist() for s in samples}

    served, replies = play("one", True)
    assert served == 2  # one request per group
    assert sorted(replies) == [f"{g}/{i}" for g in range(2) for i in range(3)]  # each episode once
    assert len({tuple(r) for r in replies.values()}) > 2  # episode i took reply i, not all the same one
    assert play("again", True)[1] == replies  # seeded by the group, not by timing
    served, alone = play("alone", False)
    assert served == 6 and sorted(alone) == sorted(replies)  # a request per episode


def _recording_worker(tmp_path: Path, tasks_file: Path, batch_groups: int) -> tuple[Any, list[list[Any]]]:
    """A real Worker whose batch writer is replaced by a recorder of the groups in each batch."""
    from rl.config import validate_config
    from rl.rollout.worker import Worker
    from rl.run.role import context_of

    raw = {
        "run": {"name": "b", "root": str(tmp_path)},
        "executor": {"type": "local"},
        "generator": {},
        "rollout": {"tasks_file": str(tasks_file), "groups": 8, "group_size": 2, "batch_groups": batch_groups},
    }
    cfg = validate_config(raw, "test", cluster="local", base_dir=tmp_path)
    worker = Worker(context_of(cfg, cfg.run_dir), cfg.rollout)
    written: list[list[Any]] = []
    worker._write_batch = lambda results: written.append(list(results))
    return worker, written


def test_a_batch_holds_batch_groups_groups_and_a_remainder_waits_unless_nothing_more_comes(
    tmp_path: Path, tasks_file: Path
) -> None:
    """The commit rule of a real Worker, its batch writer replaced by a
    recorder (the groups are placeholders: what is under test is how many go
    into each batch). Groups that finish together are not one batch: a
    learner step takes whole batches, and would eat the next version's."""
    worker, written = _recording_worker(tmp_path, tasks_file, batch_groups=2)
    worker.pending = ["g0", "g1", "g2", "g3", "g4"]  # type: ignore[list-item]
    worker.commit(partial=False)  # five finished together; more are coming
    assert written == [["g0", "g1"], ["g2", "g3"]] and worker.pending == ["g4"]
    worker.commit()  # nothing more comes (or a USR2 flush): the remainder too
    assert written[-1] == ["g4"] and worker.pending == []


def test_a_usr2_flush_waits_for_the_loops_batch_then_commits_what_is_left_and_nothing_after(
    tmp_path: Path, tasks_file: Path
) -> None:
    """The flush of a real Worker against a loop that holds its critical
    section (a batch being written) when the signal lands: it waits, then
    commits the groups the loop left, and the loop commits nothing more."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    worker, written = _recording_worker(tmp_path, tasks_file, batch_groups=4)
    worker._writer, worker.ex = object(), ThreadPoolExecutor(1)

    def loop_section() -> None:  # the loop's thread, inside its critical section
        with worker.critical():
            started.set()
            time.sleep(0.5)
            worker.pending.extend(["g0", "g1"])  # type: ignore[list-item]

    started = threading.Event()
    loop = threading.Thread(target=loop_section)
    loop.start()
    worker._loop_thread = loop.ident
    started.wait()
    worker.flush()  # lands while the section runs
    loop.join()
    assert written == [["g0", "g1"]] and worker.stopping.is_set()
    worker.pending = ["g2", "g3", "g4", "g5"]  # type: ignore[list-item]
    worker.commit()  # the loop, after the flush: the task is being requeued
    assert written == [["g0", "g1"]]


@pytest.mark.slow
def test_a_given_up_workers_share_is_played_by_another_worker_exactly_once(
    workdir: Path, tasks_file: Path, tiny_model: Path
) -> None:
    """Recovery gives worker 1 up at its first death (max_restarts = 0) and
    hands its share to worker 0 (rl.rollout.shares). Worker 0 plays the
    groups no batch holds, with the tasks worker 1 planned, and marks worker
    1's task done; worker 1 never starts again. Every episode is committed once."""
    groups, workers = 12, 2
    recovery = {"enabled": True, "check_s": 1, "beat_s": 0.5, "hung_s": 120, "max_restarts": 0}
    rollout = {"concurrency": 2, "workers": workers}
    body = _config(tasks_file, groups=groups, model=tiny_model, rollout=rollout, recovery=recovery)
    sarl("submit", str(write_config(workdir, body)), "--cluster", "local", cwd=workdir)
    run = workdir / "runs" / "r"
    store = Store(run / "store.zarr")
    try:
        one_state = run / "checkpoints" / "rollout" / "task-000001.json"
        wait_for(
            lambda: one_state.exists() and task_state(run, 1, "rollout").get("batches", 0) >= 1, 300, "worker 1's batch"
        )
        generator = _heartbeat(run, "generator", 0)["pid"]
        os.kill(generator, signal.SIGSTOP)  # worker 1 must not end before the kill lands
        try:
            planned = {int(g): t for g, t in task_state(run, 1, "rollout")["planned"].items()}
            one = _heartbeat(run, "rollout", 1)["pid"]
            os.kill(one, signal.SIGKILL)
            wait_for(lambda: not _alive(one), 60, "worker 1 to die")
        finally:
            # The generator's task 0 watches the run too: worker 0 may have
            # ended already, and then it is the watcher that hands over.
            os.kill(generator, signal.SIGCONT)
        wait_for(lambda: (run / "recovery" / "rollout" / "share-000001.json").exists(), 120, "the hand-over")
        _run_to_end(workdir, run, workers=workers)
        assert _assert_exactly_once(run, store, groups, group_size=2, workers=workers) == set()
        assert json.loads((run / "recovery" / "rollout" / "share-000001.json").read_text())["to"] == 0
        one = task_state(run, 1, "rollout")
        assert len(one["starts"]) == 1 and one["adopted_by"] == 0  # given up, its task done by worker 0
        assert "crash loop" in json.loads((run / "recovery" / "rollout" / "task-000001.json").read_text())["given_up"]
        reader = store.reader()
        by_zero = {}
        for key in reader.committed():
            if key[0] == "rollout-000000":
                info = reader.info(key)
                by_zero |= {int(e.split("/")[0]): t for e, t in zip(info.episode_ids, info.task_ids, strict=True)}
        taken = {g for g in by_zero if g % workers == 1}
        assert taken, "worker 0 committed none of worker 1's groups"
        assert all(by_zero[g] == planned[g] for g in taken if g in planned)  # the tasks worker 1 had planned
        detail = status(run)["roles"]["rollout"]["detail"][1]
        assert detail["status"] == "DONE" and "played by rollout task 0" in detail["progress"], detail
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
        time.sleep(0.5)
