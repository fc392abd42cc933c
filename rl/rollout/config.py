"""The `[rollout]` role section (pydantic only)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from rl.agent.config import AgentConfig
from rl.schema import SAFE, RoleConfig, resolved


class RolloutRole(RoleConfig):
    """Rollout workers: each array task plays episodes of its share of the
    groups against the run's generators, verifies them, and commits them in
    batches to the store, each group exactly once."""

    workers: int = Field(1, ge=1, le=10_000)
    """Number of rollout workers (the tasks of its job array)."""
    tasks_file: list[Path]
    """JSONL task file(s) to draw from: one path or a list. A relative path
    is resolved against the directory `sarl submit` runs in. Task ids must be
    unique across the files."""
    file_weights: list[float] = Field(default_factory=list)
    """Share of the groups each task file gets (fairness across files), in
    the order of `tasks_file`; empty: equal shares."""
    groups: int = Field(16, ge=1)
    """Groups to play in all (each `group_size` episodes of one task). Worker
    k plays groups k, k + tasks, k + 2 tasks, ..."""
    group_size: int = Field(4, ge=1, le=256)
    """Episodes per group: samples of one prompt, for group-relative advantages."""
    concurrency: int = Field(8, ge=1, le=1024, json_schema_extra=SAFE)
    """Episodes in flight per worker, so that generators get full batches."""
    batch_groups: int = Field(1, ge=1)
    """Groups per committed batch: a smaller batch loses less on a kill."""
    groups_per_step: int = Field(0, ge=0)
    """Groups the learner consumes per step; 0: no bound (no learner). With
    it, workers keep within `run.max_staleness`. Sync mode needs it: round
    N is groups N x groups_per_step to (N + 1) x groups_per_step - 1."""
    max_retries: int = Field(3, ge=0, json_schema_extra=SAFE)
    """Infrastructure failures (no generator, a dead sandbox) retried per episode
    before its group is abandoned, with its reason."""
    generator_wait_s: float = Field(1800.0, gt=0, json_schema_extra=SAFE)
    """Seconds an episode waits for a generator while none has announced
    itself (still queued, preempted, restarting) before that counts as an
    infrastructure failure: on a busy cluster the generators' jobs may start
    long after the workers'. The wait is counted in `generator_wait_s` of the
    worker's state."""
    episode_deadline_s: float = Field(600.0, gt=0, json_schema_extra=SAFE)
    """Seconds an episode may take; a longer one ends with reason `deadline`."""
    quarantine_after: int = Field(2, ge=1)
    """A task whose groups were abandoned this many times because their
    sandbox died is quarantined for the run (never drawn again)."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (no learning signal), counted."""
    group_request: bool = True
    """Sample the first replies of a group's episodes as one request with
    n = `group_size` (they share the prompt): one call and one queue entry
    instead of `group_size`, seeded by the group. Off: each episode asks alone."""
    agent: AgentConfig = AgentConfig()
    """The tool protocol and the budgets of each episode."""
    max_model_len: int | None = resolved("generator.engine.max_model_len")
    """The generators' context length: an episode's prompt and replies fit in it."""

    @field_validator("tasks_file", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return [v] if isinstance(v, (str, Path)) else v

    @model_validator(mode="after")
    def _check(self) -> RolloutRole:
        if not self.tasks_file:
            raise ValueError("tasks_file: give at least one task file")
        if self.file_weights and len(self.file_weights) != len(self.tasks_file):
            raise ValueError(f"file_weights: {len(self.file_weights)} weights for {len(self.tasks_file)} task files")
        if any(w <= 0 for w in self.file_weights):
            raise ValueError("file_weights: every weight must be positive")
        if self.groups_per_step > self.groups:
            raise ValueError(
                f"groups_per_step = {self.groups_per_step} is more than the {self.groups} groups the run plays: "
                "the learner could never take a step"
            )
        return self

    def weights(self) -> list[float]:
        return self.file_weights or [1.0] * len(self.tasks_file)
