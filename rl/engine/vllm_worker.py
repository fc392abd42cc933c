"""Mixed into vLLM's worker class (`worker_extension_cls`): methods that
`LLM.collective_rpc` calls by name inside each worker process."""

from __future__ import annotations

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
