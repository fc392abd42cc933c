"""The learner's ranks: torch.distributed set up from the job's environment,
and the few collectives the loop needs.

One learner task runs `job.nodes x job.tasks_per_node` processes: srun
starts them on Slurm, submitit's controller on one machine. Their ranks and
world size come from submitit's job environment. Rank 0 alone reads the
store and writes to it (state, weights, TensorBoard, checkpoint meta); it
broadcasts what a step trains on, so every rank trains on the same samples.
Gloo on CPU, NCCL on GPUs.

The ranks meet through the run directory, not at a guessed port (a port
derived from the job id collides with another job on the node, or with the
lingering socket of a requeued one, and the other ranks then waited on it
for hours): rank 0 starts torch's TCP store on a port the kernel gives it,
and publishes its address, the port it actually bound and a fresh nonce in
RUN/checkpoints/learner/rendezvous/JOB.json; the other ranks read it, join,
and check the nonce (a stale file, or a port some other store took since,
is retried until the file is right or `timeout` passes). Alone, a learner
uses no port at all.

Every collective waits at most `timeout` (`learner.collective_timeout_s`,
minutes): while rank 0 waits for rollouts the other ranks wait in a
broadcast, so rank 0 sends them a keep-alive every `KEEPALIVE_S`
(`broadcast_waiting`). A rank that stops answering makes the others fail
within `timeout`, and the learner is started again as a crash.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, TypeVar

import torch

log = logging.getLogger("sarl.learner")

KEEPALIVE_S = 30.0
"""How often rank 0, waiting for rollouts, tells the other ranks to go on
waiting (more often when the collectives' timeout is under 150 s: a fifth
of it)."""
T = TypeVar("T")


def _without_shm_op() -> None:
    """Keep DeepSpeed from building and loading its CPU shared-memory op.
    It serves only `inference_all_reduce`, which the learner never calls
    (ZeRO's collectives go through torch.distributed), and it cost:
      * a lock file: torch's JIT loader holds one in the environment's
        extensions folder at every load, while it runs ninja again. A
        learner killed then left it, and every learner of that environment
        started in the next 10 minutes (an older lock was removed), on any
        node that shares it, waited on it without end;
      * 64 MiB of /dev/shm per rank, which DeepSpeed never removes: every
        learner start left its workspace in the node's memory until a reboot;
      * a compile at the first start (about a minute).
    TorchBackend looks `build_shm_op` up at call time; None is its own
    answer where the op cannot be built."""
    import importlib

    # by name: the attribute `deepspeed.comm.torch` is the torch package, which that module imports
    backend = importlib.import_module("deepspeed.comm.torch")
    setattr(backend, "build_shm_op", lambda: None)  # noqa: B010


def _job_env() -> Any:
    import submitit

    try:
        return submitit.JobEnvironment()
    except RuntimeError:
        return None


def init_distributed(rendezvous: Path | None = None, timeout_s: float = 900.0) -> None:
    """One process group over the task's processes, met through
    `rendezvous` (a folder every rank sees); alone, on no port at all."""
    import deepspeed
    import submitit

    if torch.distributed.is_initialized():
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    env = _job_env()
    if env is not None and env.num_tasks > 1:
        if rendezvous is None:
            raise ValueError("several ranks meet through the run directory: give the rendezvous folder")
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        rank, world = int(env.global_rank), int(env.num_tasks)
        store, host, port = meet(rendezvous / f"{env.job_id}.json", rank, world, timeout_s)
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))
    else:
        rank, world = 0, 1
        store = torch.distributed.HashStore()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(os.getpid()), RANK="0", LOCAL_RANK="0")
        os.environ.update(WORLD_SIZE="1", LOCAL_SIZE="1")
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    _without_shm_op()
    deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timeout)


def meet(path: Path, rank: int, world: int, timeout_s: float) -> tuple[Any, str, int]:
    """Rank 0 starts the store on a free port and publishes it in `path`;
    the others read it and join. (store, host, port)."""
    import secrets

    from rl.fsio import read_json, write_json

    deadline = time.monotonic() + timeout_s
    wait = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        host = socket.gethostname()
        store = torch.distributed.TCPStore(
            "0.0.0.0", 0, world, is_master=True, timeout=wait, wait_for_workers=False, use_libuv=True
        )
        nonce = secrets.token_hex(16)
        store.set("sarl-nonce", nonce)
        write_json(path, {"host": host, "port": int(store.port), "nonce": nonce, "at": time.time()})
        return store, host, int(store.port)
    last = ""
    while time.monotonic() < deadline:
        rec = read_json(path) if path.exists() else None
        if rec is not None:
            try:
                join = datetime.timedelta(seconds=10)
                store = torch.distributed.TCPStore(
                    rec["host"], int(rec["port"]), world, is_master=False, timeout=join, use_libuv=True
                )
                if store.get("sarl-nonce").decode() == rec["nonce"]:
                    store.set_timeout(wait)
                    return store, str(rec["host"]), int(rec["port"])
                last = "a store of another job answered at that address"
            except (RuntimeError, OSError, KeyError, ValueError) as e:  # not up yet, or a stale file
                last = f"{type(e).__name__}: {str(e)[:200]}"
        time.sleep(0.5)
    raise TimeoutError(f"rank {rank}: no rank 0 to meet at {path} within {timeout_s:.0f} s (last: {last})")


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def world() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def broadcast(obj: T) -> T:
    """Rank 0's `obj` on every rank (pickled); alone, `obj` itself. The
    other ranks go on waiting through rank 0's `broadcast_waiting`."""
    if world() == 1:
        return obj
    while True:
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        if rank() == 0 or not isinstance(box[0], _Waiting):
            return box[0]  # type: ignore[return-value]


class _Waiting:
    """Rank 0's keep-alive: the broadcast the other ranks wait in goes on."""


def broadcast_waiting() -> None:
    """Rank 0, waiting for rollouts: keep the other ranks' broadcast within
    its timeout (call it at most every KEEPALIVE_S)."""
    if world() > 1 and rank() == 0:
        torch.distributed.broadcast_object_list([_Waiting()], src=0)


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
