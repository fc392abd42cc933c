"""Mixed into vLLM's worker class (`worker_extension_cls`): methods that
`LLM.collective_rpc` calls by name inside each worker process."""

from __future__ import annotations

from typing import Any


class StoreLoader:
    model_runner: Any

    def sarl_load_version(self, store: str, version: int, verify: bool = True) -> int:
        """Load weight `version` of the store at `store` into the live model.
        The worker maps (and unless told otherwise, verifies) the version
        itself: the weights never pass through the engine's IPC."""
        from rl.store.weights import WeightStore

        loaded, tensors = WeightStore(store).load(version, verify=verify)
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()))
        return loaded
