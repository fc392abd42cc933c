"""`sarl scale`: a role's array size changes mid-run without losing or
doubling work (real generator, rollout workers, sandboxes, verifier, store)."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_config, sarl, task_state, wait_for, write_config

from rl.store import Store
from rl.tasks.format import write_tasks
from rl.tasks.synthesis import synthesize


def _config(tiny_model: Path, tasks_file: Path, groups: int) -> str:
    return run_config(
        "s",
        executor={"type": "local"},
        model={"path": tiny_model, "dtype": "float32"},
        generator={"poll_s": 0.5, "engine": {"type": "hf", "max_model_len": 1024, "threads": 1}},
        rollout={
            "tasks_file": tasks_file,
            "groups": groups,
            "group_size": 2,
            "concurrency": 2,
            "batch_groups": 1,
            "agent": {"max_turns": 1, "max_tokens": 8},
        },
    )


@pytest.mark.slow
def test_scaling_rollout_workers_mid_run_loses_and_doubles_no_episode(workdir: Path, tiny_model: Path) -> None:
    write_tasks(workdir / "tasks.jsonl", synthesize("arithmetic", 6, seed=3))
    groups = 32
    sarl("submit", str(write_config(workdir, _config(tiny_model, workdir / "tasks.jsonl", groups))), cwd=workdir)
    run = workdir / "runs" / "s"
    store = Store(run / "store.zarr")
    try:
        wait_for(lambda: len(store.reader().committed()) >= 2, 300, "the first worker's batches")
        # The generator is frozen while the scale runs, so that the first worker cannot finish
        # its groups before it is cancelled: the scale lands mid-run however slow this machine is.
        generator = json.loads((run / "heartbeats" / "generator" / "task-000000.json").read_text())["pid"]
        os.kill(generator, signal.SIGSTOP)
        try:
            before = len(store.reader().committed())
            out = sarl("scale", str(run), "rollout=3", cwd=workdir, timeout=300)
        finally:
            os.kill(generator, signal.SIGCONT)
        assert before < groups, "the first worker finished before the scale"
        assert "scaled rollout from 1 to 3 workers" in out.stderr and "Submitted rollout job" in out.stdout
        wait_for(lambda: all(task_state(run, t, "rollout").get("done") for t in range(3)), 600, "3 workers")
        reader = store.reader()
        ids = Counter(e for k in reader.committed() for e in reader.info(k).episode_ids)
        abandoned = {int(g) for t in range(3) for g in task_state(run, t, "rollout").get("abandoned", {})}
        assert set(ids.values()) == {1}, [e for e, c in ids.items() if c > 1]  # none doubled
        played = {int(e.split("/")[0]) for e in ids}
        assert played | abandoned == set(range(groups))  # none lost
        writers = {k[0] for k in reader.committed()}
        assert len(writers) >= 2  # the new workers committed groups too
        history = [json.loads(x) for x in (run / "config-history.jsonl").read_text().splitlines()]
        assert history[-1]["scale"] == {"role": "rollout", "from": 1, "to": 3}
        assert "workers = 3" in (run / "run.toml").read_text().split("[rollout]")[1].split("[")[0]
        bad = sarl("scale", str(run), "learner=2", cwd=workdir, check=False)
        assert bad.returncode == 2 and "no [learner] section" in bad.stderr
        bad = sarl("scale", str(run), "generator=lots", cwd=workdir, check=False)
        assert bad.returncode == 2 and "expected ROLE=N" in bad.stderr
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
