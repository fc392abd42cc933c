"""The `[verify]` section: how verification checks make the reward."""

from __future__ import annotations

from pydantic import Field, field_validator

from rl.schema import Section

CHECKS = ("tests", "static", "stability", "security", "efficiency", "final_state")


class VerifyConfig(Section):
    """Weights and gates of the verification checks."""

    weights: dict[str, float] = Field(default_factory=lambda: {"tests": 1.0})
    """Weight of each check in the reward (checks not named weigh 0)."""
    gates: list[str] = Field(default_factory=lambda: ["security"])
    """Checks that zero the reward when their score is 0."""
    parallel: int = Field(0, ge=0)
    """Sandboxes verifying at once (0: one per core)."""

    @field_validator("weights")
    @classmethod
    def _known_weights(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(CHECKS))
        if unknown:
            raise ValueError(f"unknown check(s) {unknown}; checks are {list(CHECKS)}")
        if any(w < 0 for w in v.values()):
            raise ValueError("weights must be >= 0")
        return v

    @field_validator("gates")
    @classmethod
    def _known_gates(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - set(CHECKS))
        if unknown:
            raise ValueError(f"unknown check(s) {unknown}; checks are {list(CHECKS)}")
        return v
