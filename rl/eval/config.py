"""The `[eval]` role section (pydantic only): evaluate published versions
of the run on a held-out task file while it trains."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from rl.agent.config import AgentConfig
from rl.engine.config import HFEngineConfig, VLLMEngineConfig
from rl.schema import SAFE, TAG, RoleConfig


class EvalRole(RoleConfig):
    """One job that evaluates version 0 (the base model), every `every`-th
    published version and the last, each once, with an engine of its own,
    and writes pass@k per version to TensorBoard (`tb/eval/`)."""

    workers: int = Field(1, ge=1, le=1)
    """Always 1: one evaluator per run."""
    tasks_file: Path
    """Held-out tasks (JSONL); no task of it may be in the training files."""
    every: int = Field(1, ge=1)
    """Evaluate every this many published versions (and version 0, and the last)."""
    n: int = Field(1, ge=1, le=1000)
    """Samples per task."""
    k: list[int] = Field(default_factory=lambda: [1])
    """The k of pass@k reported (each <= n)."""
    agent: AgentConfig | None = None
    """The agent played; none: the rollouts' (`[rollout.agent]`)."""
    engine: VLLMEngineConfig | HFEngineConfig | None = Field(None, discriminator=TAG)
    """The evaluator's engine; none: the generators' (`[generator.engine]`)."""
    concurrency: int = Field(8, ge=1, le=256, json_schema_extra=SAFE)
    """Episodes at once."""
    poll_s: float = Field(5.0, gt=0, json_schema_extra=SAFE)
    """Seconds between looks for new versions."""

    @model_validator(mode="after")
    def _check(self) -> EvalRole:
        bad = [k for k in self.k if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"k: pass@{bad[0]} needs 1 <= k <= n = {self.n}")
        return self
