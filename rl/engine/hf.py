"""The `hf` backend: transformers `generate`, batched with left padding, on
the first CUDA device when torch sees one, else on the CPU."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from rl.engine.base import Completion, Engine
from rl.engine.config import HFEngineConfig, SamplingParams


class HFEngine(Engine):
    backend = "hf"

    def __init__(self, path: Path, dtype: str, cfg: HFEngineConfig):
        import torch
        from transformers import AutoModelForCausalLM

        from rl.model import load_tokenizer, stop_ids

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.torch = torch
        self.path = path
        self.base: Any = None
        """The float32 base a LoRA version is merged into (read at the first one)."""
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).eval()
        self.model.to(self.device)
        self.tokenizer = load_tokenizer(path)
        self.eos = stop_ids(self.tokenizer)
        self.pad = self.eos[0]
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_model_len = cfg.max_model_len
        self.lock = threading.Lock()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        torch = self.torch
        flat = [p for p in prompts for _ in range(params.n)]
        width = max(len(p) for p in flat)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in flat])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in flat])
        ends = [] if params.ignore_eos else self.eos
        ends = sorted({*ends, *params.stop_token_ids})
        kwargs: dict[str, Any] = {
            "do_sample": params.temperature > 0,
            "max_new_tokens": params.max_tokens,
            "eos_token_id": ends or None,
            "pad_token_id": self.pad,
            "output_logits": True,
            "return_dict_in_generate": True,
        }
        if params.temperature > 0:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        if params.stop:
            kwargs.update(stop_strings=params.stop, tokenizer=self.tokenizer)
        with self.lock, torch.no_grad():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs)
        sampled = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float().cpu()
        if params.temperature > 0:  # the distribution sampled from (top_p aside), as vLLM's processed log-probs
            logits = logits / params.temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, sampled[..., None])[..., 0]
        rows = [self._trim(sampled[i].tolist(), logprobs[i].tolist(), ends, params) for i in range(len(flat))]
        return [rows[k * params.n : (k + 1) * params.n] for k in range(len(prompts))]

    def _trim(self, tokens: list[int], logprobs: list[float], ends: list[int], params: SamplingParams) -> Completion:
        """Cut the padding that follows a finished row. A row ends at its
        first end token (kept), or where a stop string completed: the
        padding after it is an end token too, and is not kept."""
        for k, t in enumerate(tokens):
            if t in ends or (params.stop and t == self.pad):
                text = self.tokenizer.decode(tokens[:k])
                if params.stop and any(s in text for s in params.stop):
                    return Completion(tokens[:k], logprobs[:k], "stop")
                if t in ends:
                    return Completion(tokens[: k + 1], logprobs[: k + 1], "stop")
        text = self.tokenizer.decode(tokens) if params.stop else ""
        reason = "stop" if params.stop and any(s in text for s in params.stop) else "length"
        return Completion(tokens, logprobs, reason)

    def load_version(self, store: str | os.PathLike[str], version: int) -> None:
        from rl.engine.base import check_fits
        from rl.engine.lora import ResidentBase
        from rl.store import StoreError
        from rl.store.weights import WeightStore

        weights = WeightStore(store)
        check_fits(weights, version, self.path)
        _, tensors = weights.load(version, verify=False)  # verified just above
        record = weights.adapter(version)
        if record is not None:  # merged into the resident base copy (rl.engine.lora)
            if self.base is None:
                self.base = ResidentBase(self.path)
            tensors = self.base.merge(tensors, record)
        params = dict(self.model.named_parameters())
        missing = sorted(set(params) - set(tensors))
        if self.model.config.tie_word_embeddings and "lm_head.weight" in missing:
            missing.remove("lm_head.weight")  # tied: loaded with the embeddings
        extra = sorted(set(tensors) - set(self.model.state_dict()))
        if missing or extra:
            raise StoreError(f"version {version} does not fit the model: missing {missing[:5]}, unknown {extra[:5]}")
        shapes = [n for n, t in tensors.items() if n in params and tuple(t.shape) != tuple(params[n].shape)]
        if shapes:
            raise StoreError(f"version {version} does not fit the model: shapes differ for {shapes[:5]}")
        with self.lock, self.torch.no_grad():
            for name, t in tensors.items():
                if name in params:
                    params[name].copy_(t)  # copy_ moves it to the parameter's device
        self.version = version
