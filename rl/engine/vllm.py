"""The `vllm` backend: vLLM's offline engine, fed token ids."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rl.engine.base import Completion, Engine, check_fits
from rl.engine.config import SamplingParams, VLLMEngineConfig


def in_process(cfg: VLLMEngineConfig) -> bool:
    """Whether the engine core runs in the building process (`engine_core`)."""
    if cfg.engine_core != "auto":
        return cfg.engine_core == "in-process"
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


@contextmanager
def _host_kept(inproc: bool) -> Iterator[None]:
    """vLLM's engine core assumes a process of its own: at its start it seeds
    random, numpy and torch with the engine's seed, freezes the garbage
    collector's heap, caches the environment, and its CPU worker disables
    `torch.set_num_threads`. In process, each is undone for the process that
    goes on beside it."""
    if not inproc:
        yield
        return
    import gc
    import random

    import numpy as np
    import torch
    import vllm.envs

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    set_threads = torch.set_num_threads
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        torch.set_num_threads = set_threads
        gc.unfreeze()
        vllm.envs.disable_envs_cache()


def _llm(path: Path, dtype: str, cfg: VLLMEngineConfig, seed: int) -> Any:
    from vllm import LLM

    return LLM(
        model=str(path),
        dtype=dtype,  # type: ignore[arg-type]  # a str from ModelConfig.dtype's Literal
        seed=seed,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        # a whole prompt fits in one step (and vLLM wants a step to hold a token of every sequence),
        max_num_batched_tokens=max(cfg.step_tokens, cfg.max_model_len, cfg.max_num_seqs),
        # and it is never split over steps: on CPU, a seeded sequence whose prompt was split kills
        # the engine ("CPU Generator does not use offset": it cannot rewind the sampler's
        # generator for the discarded token of a partial prefill)
        enable_chunked_prefill=False,
        # an episode's next turn re-sends its history, and a group's sequences share their prompt:
        # their prefill is found in the cache (dropped at every weight swap: stale KV)
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",  # of the distribution sampled from: after temperature
        enforce_eager=cfg.enforce_eager,
        kv_cache_memory_bytes=int(cfg.kv_cache_gb * (1 << 30)),
        worker_extension_cls="rl.engine.vllm_worker.Extension",
    )


class VLLMEngine(Engine):
    backend = "vllm"

    def __init__(self, path: Path, dtype: str, cfg: VLLMEngineConfig, seed: int = 0):
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cfg.cpu_reserved_cores)
        self.in_process = in_process(cfg)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
        self.path = path
        with _host_kept(self.in_process):
            self.llm = _llm(path, dtype, cfg, seed)
        if not self.in_process:  # in process, it ends with this process
            self.llm.collective_rpc("sarl_exit_with", args=(os.getpid(),))
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.max_model_len = cfg.max_model_len
        config = self.llm.llm_engine.vllm_config
        self.step_tokens = int(config.scheduler_config.max_num_batched_tokens)
        cache = config.cache_config
        blocks = (cache.num_gpu_blocks or 0) * (cache.block_size or 0)
        self.kv_tokens = int(cache.kv_cache_size_tokens or blocks)
        self.lock = threading.Lock()

    @staticmethod
    def _params(params: SamplingParams) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=params.stop or None,
            stop_token_ids=params.stop_token_ids or None,
            include_stop_str_in_output=True,
            ignore_eos=params.ignore_eos,
            seed=params.seed,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    @staticmethod
    def _completions(output: Any) -> list[Completion]:
        row = []
        for c in output.outputs:
            ids = list(c.token_ids)
            lps = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)] if c.logprobs else []
            row.append(Completion(ids, lps, "length" if c.finish_reason == "length" else "stop"))
        return row

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        with self.lock:
            outs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompts], self._params(params), use_tqdm=False
            )
        return [self._completions(o) for o in outs]

    # Continuous batching, for the generator service: requests join the
    # running batch at the next decoding step, and leave it when they finish.
    continuous = True

    def add(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        from vllm.inputs import TokensPrompt

        with self.lock:
            self.llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), self._params(params))

    def step(self) -> list[tuple[str, list[Completion]]]:
        """One engine step; the requests that finished in it."""
        with self.lock:
            outs = self.llm.llm_engine.step()
        return [(o.request_id, self._completions(o)) for o in outs if o.finished]

    def load_version(self, store: str | os.PathLike[str], version: int) -> None:
        from rl.store.weights import WeightStore

        # Verified here, before the engine is touched: a corrupt or missing
        # version, or an adapter that does not fit the base, raises its own
        # StoreError and the engine keeps its weights. The worker then maps
        # the same immutable files without hashing again.
        check_fits(WeightStore(store), version, self.path)
        with self.lock:
            self.llm.collective_rpc("sarl_load_version", args=(str(store), int(version), False))
            self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights
        self.version = version

    def load_checkpoint(self, folder: str | os.PathLike[str]) -> None:
        """Replace the weights with a safetensors checkpoint folder's, through
        vLLM's own reload (what `sarl bench generate` compares against)."""
        with self.lock:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        shutdown = getattr(self.llm.llm_engine, "shutdown", None) or getattr(
            self.llm.llm_engine.engine_core, "shutdown", None
        )
        if shutdown is not None:
            shutdown()
