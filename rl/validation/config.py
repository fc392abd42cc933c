"""The `[validation]` role section (pydantic only)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from rl.schema import RoleConfig


class ValidationRole(RoleConfig):
    """Task validation as a job array: each array task validates every
    `workers`-th task of `tasks_file`; `sarl tasks report RUN_DIR` merges."""

    workers: int = Field(4, ge=1, le=100_000)
    """Number of shards, each a task of the job array."""
    tasks_file: Path
    """JSONL task file to validate. A relative path is resolved against the
    directory `sarl submit` runs in."""
    repeats: int = Field(3, ge=1)
    """Runs of each reference; results must agree (else flaky)."""
