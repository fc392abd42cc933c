"""Helpers of the learner's tests: rollouts committed for a learner to train on,
a learner run's config, start, state and published weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from conftest import merged, run_config, sarl, task_state, write_config

from rl.store import Sample, Store


def rollout_batches(tiny_model: Path, groups: int, group_size: int = 2, per_batch: int = 2) -> list[list[Sample]]:
    """Batches as rollout workers write them: whole groups, the prompt
    masked, the reference as the sampled tokens."""
    from rl.model import chat_ids, load_tokenizer
    from rl.tasks.importers import import_humaneval

    tok = load_tokenizer(tiny_model)
    tasks = import_humaneval()
    rng = np.random.default_rng(0)
    batches: list[list[Sample]] = []
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
            batches.append(batch)
            batch = []
    return batches


def commit_rollouts(run: Path, tiny_model: Path, groups: int, group_size: int = 2, per_batch: int = 2) -> None:
    writer = Store(run / "store.zarr").writer("rollout-000000")
    for batch in rollout_batches(tiny_model, groups, group_size, per_batch):
        writer.write(writer.next_seq(), batch)


def learner_config(
    tiny_model: Path, steps: int, learner: dict[str, Any] | None = None, ranks: int = 1, **sections: Any
) -> str:
    """A learner alone, on batches the test commits, all sampled by version 0:
    the staleness bound is set past the run's steps, so that none is dropped.
    `learner`: keys of the learner section over these (sub-sections merged);
    `sections`: other sections, `run` merged with the run's own keys."""
    base = {
        "steps": steps,
        "samples_per_step": 4,
        "micro_batches": 2,
        "poll_s": 0.2,
        "precision": "float32",  # exact steps and their order; bf16: tests/test_precision.py
        "job": {"tasks_per_node": ranks, "mem_gb": 6},
        "optimizer": {"lr": 1e-3},
    }
    run = merged({"max_staleness": 1000}, sections.pop("run", {}))
    return run_config(
        "l",
        recovery=False,  # a test of the manual path (sarl resume); tests/test_recovery.py turns it on
        run=run,
        executor={"type": "local"},
        model={"path": tiny_model, "dtype": "float32"},
        learner=merged(base, learner or {}),
        **sections,
    )


def learner_state(run: Path) -> dict:
    try:
        return task_state(run, 0, "learner")
    except (FileNotFoundError, ValueError):
        return {}


def published_weights(run: Path, version: int) -> dict[str, np.ndarray]:
    _, tensors = Store(run / "store.zarr").weights.load(version)
    return {k: np.asarray(v).copy() for k, v in tensors.items()}


def start_learner(
    workdir: Path,
    name: str,
    tiny_model: Path,
    steps: int,
    learner: dict[str, Any] | None = None,
    cluster: str = "local",
    ranks: int = 1,
    groups: int | None = None,
) -> Path:
    folder = workdir / name
    folder.mkdir()
    cfg = write_config(folder, learner_config(tiny_model, steps, learner, ranks))
    run = folder / "runs" / "l"
    # the run directory first (submit creates it), then the rollouts a learner waits for
    sarl("submit", str(cfg), "--cluster", cluster, cwd=folder)
    commit_rollouts(run, tiny_model, groups=2 * steps if groups is None else groups)
    return run


def learner_pid(run: Path) -> int | None:

    path = run / "heartbeats" / "learner" / "task-000000.json"
    try:
        pid = int(json.loads(path.read_text())["pid"])
    except (FileNotFoundError, ValueError, KeyError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def close_enough(diff: np.ndarray) -> bool:
    """ZeRO-3's tolerance against stage 0: fewer than 1 in 1,000 weights
    off by more than 1e-6, none by more than 2 x lr (1e-3). Adam's first
    step, g / (|g| + eps), moves a weight by up to lr either way where its
    gradient is near 0, so a gradient summed in another order can put one
    weight 2 x lr away. ZeRO-3 also takes its log-probs from the engine's
    forward, where stage 0 projects the hidden states itself: the logits
    differ in their last bits. Measured with one thread: 6 of 6.4M off after
    one step, 1,733 after three; the largest 1.4e-4. A wrong gather or a
    wrongly trained layer moves millions (6.2M of 6.4M, when the output
    layer ran apart from ZeRO-3's forward)."""
    return float(diff.max()) <= 2e-3 and int((diff > 1e-6).sum()) < diff.size / 1_000
