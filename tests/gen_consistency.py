"""Greedy completions of the same prompts by the vLLM and the HF backends, on
the same weights, printed as one JSON object (run by test_generate.py in a
process of its own: vLLM starts worker processes)."""

from __future__ import annotations

import json
import sys

from rl.engine import make_engine
from rl.engine.config import HFEngineConfig, ModelConfig, SamplingParams, VLLMEngineConfig
from rl.model import chat_ids, checkpoint, load_tokenizer

QUESTIONS = [
    "Write a Python function that adds two numbers.",
    "What is 2+3?",
    "Name a color.",
    "Write a haiku about the sea.",
]


def main(cache_dir: str) -> None:
    model = ModelConfig(dtype="float32", cache_dir=cache_dir)
    tok = load_tokenizer(checkpoint(model))
    prompts = [chat_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    greedy = SamplingParams(temperature=0, max_tokens=40)
    out = {}
    for name, cfg in (("hf", HFEngineConfig()), ("vllm", VLLMEngineConfig(kv_cache_gb=0.5, max_model_len=1024))):
        engine = make_engine(cfg, model)
        rows = engine.generate(prompts, greedy)
        out[name] = [r[0].to_json() for r in rows]
        engine.close()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
