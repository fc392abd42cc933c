"""Rollout workers: bad input refused before submission, and every group
committed exactly once, or abandoned with a reason, through SIGKILLs of the
worker (real generator, real sandboxes, real verifier, real store)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import sarl, task_state, wait_for, write_config

from rl.store import Store
from rl.tasks.format import write_tasks
from rl.tasks.importers import import_humaneval


@pytest.fixture
def tasks_file(workdir: Path) -> Path:
    path = workdir / "tasks.jsonl"
    write_tasks(path, import_humaneval()[:8])
    return path


def _config(tasks_file: Path, extra: str = "", generator: bool = True, groups: int = 6) -> str:
    gen = """
[generator]
poll_s = 0.5
[generator.engine]
type = "hf"
max_model_len = 1024
"""
    return f"""
[run]
name = "r"
root = "runs"
[executor]
type = "local"
[model]
dtype = "float32"
{gen if generator else ""}
[rollout]
tasks_file = "{tasks_file}"
groups = {groups}
group_size = 2
concurrency = 4
[rollout.agent]
max_turns = 1
max_tokens = 24
{extra}
"""


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"generator": False}, "rollout workers need generators: add a [generator] section"),
        ({"extra": "[rollout.x]\n"}, "rollout.x: unknown key"),
        ({"extra": "max_staleness = -1\n", "where": "rollout"}, "rollout.max_staleness"),
        ({"bad_tasks": True}, "rollout.tasks_file"),
    ],
)
def test_bad_rollout_input_is_refused_before_submission(
    workdir: Path, tasks_file: Path, change: dict, words: str
) -> None:
    if change.get("bad_tasks"):
        tasks_file.write_text('{"task_id": "t", "prompt": "x"}\n')
    extra = change.get("extra", "")
    body = _config(tasks_file, generator=change.get("generator", True))
    if change.get("where") == "rollout":
        body = body.replace("concurrency = 4\n", "concurrency = 4\n" + extra)
    else:
        body += extra
    out = sarl("submit", str(write_config(workdir, body)), cwd=workdir, check=False)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert not (workdir / "runs" / "r").exists()
    if change.get("bad_tasks"):
        assert "tasks.jsonl:1" in out.stderr  # names the line


def _worker_pid(run: Path) -> int | None:
    """The controller of the newest rollout submission, if it runs."""
    import json

    subs = sorted((run / "submissions" / "rollout").glob("*.json"))
    pid = int(json.loads(subs[-1].read_text())["job_ids"][0])
    return pid if Path(f"/proc/{pid}").exists() else None


@pytest.mark.slow
def test_every_group_is_committed_once_through_sigkills(workdir: Path, tasks_file: Path) -> None:
    cfg = write_config(workdir, _config(tasks_file, groups=6))
    sarl("submit", str(cfg), cwd=workdir)
    run = workdir / "runs" / "r"
    store = Store(run / "store.zarr")
    try:
        kills = 0
        for target in (1, 2):  # kill the worker after it committed 1, then 2 batches
            wait_for(lambda t=target: len(store.reader().committed()) >= t, 300, f"{target} batch(es)")
            pid = _worker_pid(run)
            if pid is None:
                break
            os.killpg(pid, signal.SIGKILL)
            kills += 1
            wait_for(lambda: _worker_pid(run) is None, 30, "the killed worker to be gone")
            out = sarl("resume", str(run), cwd=workdir)
            assert "rollout tasks 0" in out.stderr, out.stderr
        assert kills >= 1
        wait_for(lambda: task_state(run, 0, "rollout").get("done"), 600, "the rollout worker to finish")
        reader = store.reader()
        groups: Counter[int] = Counter()
        for key in reader.committed():
            groups.update(int(g) for g in reader.read(key).group_id)
        state = task_state(run, 0, "rollout")
        abandoned = {int(g) for g in state["abandoned"]}
        assert set(groups) | abandoned == set(range(6)) and not set(groups) & abandoned
        assert all(n == 2 for n in groups.values()), groups  # each group once, whole
        assert len(state["starts"]) == kills + 1
        batch = reader.read(reader.committed()[0]).samples()[0]
        assert batch.versions is not None and set(batch.versions[batch.loss_mask == 1]) == {0}

        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run / "tb" / "rollout-000000"), size_guidance={"scalars": 0})
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"rollout/reward_mean", "rollout/episodes_per_s", "rollout/time/verify_s", "rollout/turns"} <= tags
        steps = [e.step for e in acc.Scalars("rollout/batches")]
        assert steps == sorted(steps) and steps[-1] == 12  # through restarts, steps never go back
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
        time.sleep(0.5)
