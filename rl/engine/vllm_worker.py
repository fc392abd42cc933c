"""Mixed into vLLM's worker class (`worker_extension_cls`): methods that
`LLM.collective_rpc` calls by name inside each worker process."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Any


class StoreLoader:
    model_runner: Any

    def sarl_load_version(self, store: str, version: int, verify: bool = True) -> int:
        """Load weight `version` of the store at `store` into the live model.
        The worker maps (and unless told otherwise, verifies) the version
        itself: the weights never pass through the engine's IPC. A version
        of LoRA adapters is merged into this worker's resident float32 copy
        of the base (rl.engine.lora), read once from the engine's model folder."""
        from rl.engine.lora import ResidentBase
        from rl.store.weights import WeightStore

        weights = WeightStore(store)
        loaded, tensors = weights.load(version, verify=verify)
        record = weights.adapter(version)
        if record is not None:
            base = getattr(self, "_sarl_base", None)
            if base is None:
                base = self._sarl_base = ResidentBase(self.model_runner.model_config.model)
            tensors = base.merge(tensors, record)
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()))
        return loaded


class ExitsWithParent:
    def sarl_exit_with(self, pid: int) -> None:
        """End this worker's process when process `pid` (the one that built
        the LLM) ends. vLLM's engine core is a child process that outlives a
        parent killed by SIGKILL (or the OOM killer), holding its memory and
        cores; Slurm reaps it with the job's cgroup, a local run does not.
        Called only for an engine core of its own (`engine_core`): one in
        process ends with it. On CPU that core runs its worker in a process
        beside it; the worker ends, and the core, its worker gone, ends too
        (tests/test_generate.py)."""
        threading.Thread(target=_end_with, args=(pid,), name="sarl-exit-with-parent", daemon=True).start()


def _end_with(pid: int) -> None:
    try:
        # a pidfd turns readable when the process ends, and is immune to pid reuse
        fd = os.pidfd_open(pid)
        select.select([fd], [], [])
    except ProcessLookupError:
        pass  # already gone
    except OSError:  # a kernel before 5.3: poll
        from rl.lifetime import alive

        while alive(pid):
            time.sleep(1.0)
    # SIGTERM first: the engine core's handler shuts down cleanly; SIGKILL if it does not
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10.0)
    os.kill(os.getpid(), signal.SIGKILL)


class Extension(StoreLoader, ExitsWithParent):
    """What `worker_extension_cls` names: every method above, in one class."""
