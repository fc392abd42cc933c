"""`sarl serve`: the OpenAI-compatible endpoint on an engine of its own,
outside any run, for a user's own tools and evaluation harnesses.

It serves a run's weight version (the newest published, or `version`) on
the run's model and engine, or an exported checkpoint folder
(`sarl export`). The engine runs in a generator service of this process,
under the same limits as a generator of a run (rl.serving.service), and
the gateway (rl.gateway.server) sits in front of it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.errors import ConfigError
from rl.layout import RunLayout


@dataclass
class Served:
    gateway: Any
    key: str
    """The bearer token clients must send."""
    model: str
    """The model's name in requests."""
    version: int
    """The weight version served (0: the base checkpoint or an export)."""
    source: str


def api_key() -> tuple[str, bool]:
    """(the key, whether it was generated): `SARL_API_KEY`, else a new one."""
    given = os.environ.get("SARL_API_KEY", "").strip()
    return (given, False) if given else ("sk-sarl-" + secrets.token_urlsafe(24), True)


@contextlib.contextmanager
def serving(
    path: Path, version: int | None, engine: str | None, host: str, port: int, key: str, name: str | None = None
) -> Iterator[Served]:
    """The endpoint, started, until the block ends."""
    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig, VLLMEngineConfig
    from rl.gateway.backends import ServiceBackend
    from rl.gateway.server import Gateway
    from rl.model import ModelConfig, checkpoint, load_tokenizer
    from rl.serving.service import GeneratorServer

    run = RunLayout(path).exists()
    if not run and not (path / "config.json").is_file():
        raise ConfigError(f"{path}: neither a run directory (run.toml) nor a checkpoint folder (config.json)")
    if not run and version is not None:
        raise ConfigError(f"--version: {path} is a checkpoint folder, which has one version")
    store = None
    if run:
        from rl.run.rundir import RunDir
        from rl.store import Store

        cfg = RunDir(path).config()
        model, engine_cfg = cfg.model, cfg.engine()
        store = Store.of_run(path)
        latest = store.weights.latest()
        if version is None:
            version = latest or 0
        elif version != 0 and (latest is None or not 0 <= version <= latest):
            raise ConfigError(
                f"--version {version}: {path} has published versions 0 to {latest if latest is not None else '(none)'}"
            )
        name = name or cfg.run.name
    else:
        model, version = ModelConfig(path=str(path), dtype="float32"), 0
        engine_cfg = VLLMEngineConfig()
        name = name or path.resolve().name
    if engine is not None:
        engine_cfg = {"hf": HFEngineConfig, "vllm": VLLMEngineConfig}[engine](max_model_len=engine_cfg.max_model_len)
    with contextlib.ExitStack() as stack:
        eng = make_engine(engine_cfg, model)
        stack.callback(eng.close)
        server = GeneratorServer(eng, bind="127.0.0.1", token=secrets.token_urlsafe(16)).start()
        stack.callback(server.stop)
        if store is not None and version:
            with store.weights.pinned_while(f"serve-{os.getpid()}", version):
                server.swap(str(store.path), version)
        gw = Gateway(
            ServiceBackend(server), load_tokenizer(checkpoint(model)), model=name, token=key, bind=host, port=port
        )
        gw.start()
        stack.callback(gw.stop)
        yield Served(gw, key, name, version, str(path))
