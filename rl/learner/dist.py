"""The learner's ranks: torch.distributed set up from the job's environment,
and the few collectives the loop needs.

One learner task runs `job.nodes x job.tasks_per_node` processes: srun
starts them on Slurm, submitit's controller on one machine. Their ranks,
world size and master address (the first host of the node list) come from
submitit's job environment. Rank 0 alone reads the store and writes to it
(state, weights, TensorBoard, checkpoint meta); it broadcasts what a step
trains on, so every rank trains on the same samples. Gloo on CPU, NCCL on
GPUs.

The collectives wait while rank 0 waits for rollouts, so the process
group's timeout is long (`TIMEOUT`): a learner starved of rollouts for
longer fails its collective and is resubmitted, as a crash.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

import torch

log = logging.getLogger("sarl.learner")

TIMEOUT = datetime.timedelta(hours=12)
T = TypeVar("T")


def build_ops() -> None:
    """Build (or find built) the C++ op DeepSpeed's CPU communication loads
    at init. torch waits forever on the lock of a build that was killed
    (a SIGKILLed learner mid-build): a lock older than 10 minutes, when no
    build takes that long, is removed first."""
    # The build is keyed by its sources' paths, which lie inside the environment: two
    # environments sharing torch's default folder would rebuild it at every switch
    if os.access(sys.prefix, os.W_OK):  # not in a read-only environment (a container's)
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    from deepspeed.comm.torch import build_shm_op
    from torch.utils.cpp_extension import _get_build_directory

    root = Path(_get_build_directory("x", verbose=False)).parent
    for lock in root.glob("*/lock"):
        if time.time() - lock.stat().st_mtime > 600:
            log.warning("removing a stale build lock %s", lock)
            lock.unlink(missing_ok=True)
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints its build on stdout
        build_shm_op()


def _job_ranks() -> int:
    import submitit

    try:
        return int(submitit.JobEnvironment().num_tasks)
    except RuntimeError:
        return 1


def init_distributed() -> None:
    """One process group over the task's processes; alone, on a free local port."""
    import deepspeed
    import submitit

    if torch.distributed.is_initialized():
        return
    if _job_ranks() > 1:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    elif "MASTER_ADDR" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    build_ops()
    deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=TIMEOUT)


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def world() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def broadcast(obj: T) -> T:
    """Rank 0's `obj` on every rank (pickled); alone, `obj` itself."""
    if world() == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def all_sum(values: list[float]) -> list[float]:
    """The element-wise sum of `values` over the ranks."""
    if world() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return [float(x) for x in t]


def all_max(value: float) -> float:
    """The largest `value` over the ranks."""
    if world() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t[0])


def barrier() -> None:
    if world() > 1:
        torch.distributed.barrier()


def describe() -> dict[str, Any]:
    return {"rank": rank(), "world": world(), "master": os.environ.get("MASTER_ADDR", "")}
