"""The `[generator]` role section (pydantic only)."""

from __future__ import annotations

from pydantic import Field

from rl.engine.config import EngineConfig, VLLMEngineConfig
from rl.schema import SAFE, RoleConfig


class GeneratorRole(RoleConfig):
    """Generators: each task serves the policy over HTTP (token ids in and
    out), announces itself in `endpoints/`, and loads every new weight
    version from the store without restarting."""

    workers: int = Field(1, ge=1, le=10_000)
    """Number of generators (the tasks of its job array)."""
    engine: EngineConfig = Field(default_factory=VLLMEngineConfig)
    """Inference backend: `vllm` or `hf`, with its settings."""
    bind: str = "0.0.0.0"
    """Address the HTTP service listens on."""
    port: int = Field(0, ge=0, le=65535)
    """0: any free port; else task N listens on `port + N`."""
    poll_s: float = Field(2.0, gt=0, json_schema_extra=SAFE)
    """Seconds between looks for a new weight version (and announcements)."""
    max_queue: int = Field(256, ge=1, json_schema_extra=SAFE)
    """Requests queued at most; beyond it the service answers 503 (back-pressure)."""
    max_batch: int = Field(64, ge=1, json_schema_extra=SAFE)
    """Completions in the engine at once at most: sequences in flight (vLLM,
    continuous batching), or the size of one `generate` batch (HF)."""
    serve_s: float | None = Field(None, gt=0, json_schema_extra=SAFE)
    """Stop serving after this many seconds (none: until cancelled)."""
