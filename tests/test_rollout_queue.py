"""The rollout queue: priorities from the pass rates of every committed
batch, fairness across task files by weight, quarantine, and draws that do
not depend on which process makes them (real store, real task files)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rl.rollout.queue import TaskQueue, priority
from rl.store import Sample, Store
from rl.tasks.format import write_tasks
from rl.tasks.importers import import_humaneval
from rl.tasks.quarantine import quarantine, quarantined

TASKS = import_humaneval()[:12]


def _sample(task_id: str, group: int, i: int, passed: bool) -> Sample:
    n = 4
    return Sample(
        task_id=task_id,
        group_id=group,
        policy_version=0,
        tokens=np.arange(n, dtype=np.int32),
        loss_mask=np.array([0, 1, 1, 1], dtype=np.uint8),
        logprobs=np.zeros(n, dtype=np.float32),
        reward=1.0 if passed else 0.0,
        failure="" if passed else "wrong-answer",
        episode_id=f"{group}/{i}",
    )


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_tasks(a, TASKS[:6])
    write_tasks(b, TASKS[6:])
    return [a, b]


def test_priority_puts_under_sampled_then_informative_tasks_first() -> None:
    assert priority(0, 0) == pytest.approx(1.25)  # the docstring's hand-checked values
    assert priority(16, 8) == pytest.approx(0.25 * 1 + 1 / np.sqrt(17), rel=1e-3)
    assert priority(0, 0) > priority(16, 8) > priority(16, 0) > priority(100, 0)
    assert priority(16, 8) > priority(16, 16)  # informative (mixed) beats always passing


def test_draws_follow_the_pass_rates_that_every_writer_committed(tmp_path: Path, files: list[Path]) -> None:
    store = Store.of_run(tmp_path)
    seen = [t.task_id for t in TASKS[:5]]  # 5 of the 6 tasks of file a: 40 samples each, all failed
    for w, tid in enumerate(seen):
        store.writer(f"rollout-{w:06d}").write(0, [_sample(tid, 100 + w, i, False) for i in range(40)])
    queue = TaskQueue([files[0]], [1.0], seed=3, run_dir=tmp_path, group_size=4)
    drawn = Counter(queue.choose(g, {}, set()).task_id for g in range(400))  # type: ignore[union-attr]
    unseen = TASKS[5].task_id
    # weights: 1.25 for the unseen task against 0.02 + 0.156 for each seen one
    assert drawn[unseen] > 0.5 * 400, drawn
    assert all(drawn[t] < drawn[unseen] / 3 for t in seen), drawn


def test_the_draw_of_a_group_is_the_same_in_any_process(tmp_path: Path, files: list[Path]) -> None:
    queue = TaskQueue(files, [1.0, 1.0], seed=11, run_dir=tmp_path, group_size=2)
    here = [queue.choose(g, {}, set()).task_id for g in range(20)]  # type: ignore[union-attr]
    code = (
        "import sys; from pathlib import Path; from rl.rollout.queue import TaskQueue\n"
        f"q = TaskQueue([Path({str(files[0])!r}), Path({str(files[1])!r})], [1.0, 1.0], 11, {str(tmp_path)!r}, 2)\n"
        "print(' '.join(q.choose(g, {}, set()).task_id for g in range(20)))\n"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert here == there and len(set(here)) > 3


def test_files_get_their_weighted_share_and_quarantined_tasks_are_never_drawn(
    tmp_path: Path, files: list[Path]
) -> None:
    queue = TaskQueue(files, [3.0, 1.0], seed=0, run_dir=tmp_path, group_size=2, refresh_s=0.0)
    out = quarantine(tmp_path, TASKS[0].task_id, "flaky reference", by="test")
    assert out and not quarantine(tmp_path, TASKS[0].task_id, "again", by="test")  # the first reason stands
    assert quarantined(tmp_path) == {TASKS[0].task_id: "flaky reference"}
    planned: dict[int, str] = {}
    for g in range(40):
        planned[g] = queue.choose(g, planned, set(planned)).task_id  # type: ignore[union-attr]
    in_a = sum(tid in {t.task_id for t in TASKS[:6]} for tid in planned.values())
    assert in_a == 30  # 3:1, exactly: the file furthest behind its share goes next
    assert TASKS[0].task_id not in planned.values()
    # an unreadable entry still keeps its task out
    entry = next((tmp_path / "quarantine").glob("*.json"))
    entry.write_text("{not json")
    assert "unreadable" in quarantined(tmp_path, [TASKS[0].task_id])[TASKS[0].task_id]
    for t in TASKS:
        quarantine(tmp_path, t.task_id, "all out", by="test")
    assert queue.choose(99, planned, set()) is None


def test_sarl_tasks_quarantine_names_what_is_wrong_and_lists_reasons(tmp_path: Path, files: list[Path]) -> None:
    from conftest import sarl

    from rl.config import validate_config
    from rl.run.rundir import RunDir

    raw = {
        "run": {"name": "q", "root": str(tmp_path)},
        "generator": {},
        "rollout": {"tasks_file": [str(f) for f in files]},
    }
    cfg = validate_config(raw, "test", cluster="local")
    RunDir(cfg.run_dir).create(cfg)
    run = str(cfg.run_dir)
    bad = sarl("tasks", "quarantine", run, "HumanEval/999", "--reason", "x", cwd=tmp_path, check=False)
    assert bad.returncode != 0 and "task_id: 'HumanEval/999' is not in the run" in bad.stderr
    none = sarl("tasks", "quarantine", str(tmp_path), "HumanEval/1", "--reason", "x", cwd=tmp_path, check=False)
    assert none.returncode != 0 and "not a run directory" in none.stderr
    sarl("tasks", "quarantine", run, "HumanEval/7", "--reason", "flaky tests", cwd=tmp_path)
    out = sarl("tasks", "quarantined", run, cwd=tmp_path)
    assert json.loads(out.stdout) == {"HumanEval/7": "flaky tests"}
    queue = TaskQueue(files, [1.0, 1.0], seed=0, run_dir=cfg.run_dir, group_size=2)
    assert all(queue.choose(g, {}, set()).task_id != "HumanEval/7" for g in range(200))  # type: ignore[union-attr]
