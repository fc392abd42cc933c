"""The learner's Trainer at each ZeRO stage, in one process (world size 1),
on the same samples from the same weights; prints one JSON line per stage.

    python tests/zero_worker.py MODEL_DIR WORK_DIR STAGE [STAGE ...]

For each stage it reports:
* `step1`: the weights after one finite step (gathered under ZeRO-3), as
  a path to a .npz the test compares across stages;
* `inf_applied`: whether a step whose gradient a hook makes infinite (the
  loss stays finite) was applied, and whether it changed the weights or
  the schedule;
* `resume_same`: whether a fresh Trainer that loads the checkpoint saved
  after step 1 takes step 2 to the weights the first one reaches.

Run as a subprocess by tests/test_learner.py: torch.distributed is set up
once per process, and the test process should not hold it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_runs import rollout_batches  # noqa: E402

from rl.learner.config import LearnerRole  # noqa: E402
from rl.learner.trainer import Trainer  # noqa: E402


def _weights(t: Trainer) -> dict[str, np.ndarray]:
    return {k: v.float().numpy().copy() for k, v in t.state_dict().items()}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def main() -> None:
    model, work, stages = Path(sys.argv[1]), Path(sys.argv[2]), [int(x) for x in sys.argv[3:]]
    first, second = rollout_batches(model, groups=4, per_batch=2)[:2]
    for stage in stages:
        lc = LearnerRole.model_validate(
            {"zero_stage": stage, "samples_per_step": 4, "micro_batches": 2, "optimizer": {"lr": 1e-3}}
            | {"precision": "float32"}
        )
        t = Trainer(str(model), lc)
        before = _weights(t)
        assert t.step(first) is not None
        step1 = _weights(t)
        np.savez(work / f"step1-{stage}.npz", **step1)
        t.save(work / f"ckpt-{stage}")
        # a gradient made infinite by a hook: the loss stays finite, only the gradient is not
        param = next(p for p in t.engine.module.parameters() if p.requires_grad)
        hook = param.register_hook(lambda g: g * float("inf"))
        epoch = t.scheduler.last_epoch
        inf = t.step(second)
        hook.remove()
        inf_changed = not _same(step1, _weights(t)) or t.scheduler.last_epoch != epoch
        assert t.step(second) is not None
        step2 = _weights(t)
        fresh = Trainer(str(model), lc)
        fresh.load(work / f"ckpt-{stage}")
        assert fresh.step(second) is not None
        out = {
            "stage": stage,
            "step1": str(work / f"step1-{stage}.npz"),
            "trained": not _same(before, step1),
            "inf_applied": inf is not None,
            "inf_changed": inf_changed,
            "resume_same": _same(step2, _weights(fresh)),
        }
        print("ZERO " + json.dumps(out), flush=True)
        del t, fresh
        torch.cuda.empty_cache() if torch.cuda.is_available() else None


if __name__ == "__main__":
    main()
