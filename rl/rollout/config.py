"""The `[rollout]` role section (pydantic only)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from rl.agent.config import AgentConfig
from rl.run.config import RoleConfig
from rl.schema import SAFE


class RolloutRole(RoleConfig):
    """Rollout workers: each array task plays episodes of its share of the
    groups against the run's generators, verifies them, and commits them in
    batches to the store, each group exactly once."""

    tasks: int = Field(1, ge=1, le=10_000)
    """Number of rollout workers (array tasks)."""
    tasks_file: Path
    """JSONL task file to draw from. A relative path is resolved against the
    directory `sarl submit` runs in."""
    groups: int = Field(16, ge=1)
    """Groups to play in all (each `group_size` episodes of one task). Worker
    k plays groups k, k + tasks, k + 2 tasks, ..."""
    group_size: int = Field(4, ge=1, le=256)
    """Episodes per group: samples of one prompt, for group-relative advantages."""
    concurrency: int = Field(8, ge=1, le=1024, json_schema_extra=SAFE)
    """Episodes in flight per worker, so that generators get full batches."""
    batch_groups: int = Field(1, ge=1)
    """Groups per committed batch: a smaller batch loses less on a kill."""
    max_staleness: int = Field(4, ge=0)
    """A worker starts group g only while g < (max_staleness + v + 1) x
    groups_per_step, v being the newest published weight version: it never
    runs further ahead of the learner than this (AReaL's capacity rule)."""
    groups_per_step: int = Field(0, ge=0)
    """Groups the learner consumes per step; 0: no bound (no learner)."""
    max_retries: int = Field(3, ge=0, json_schema_extra=SAFE)
    """Infrastructure failures (no generator, a dead sandbox) retried per episode
    before its group is abandoned, with its reason."""
    episode_deadline_s: float = Field(600.0, gt=0, json_schema_extra=SAFE)
    """Seconds an episode may take; a longer one ends with reason `deadline`."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (no learning signal), counted."""
    agent: AgentConfig = AgentConfig()
    """The tool protocol and the budgets of each episode."""
