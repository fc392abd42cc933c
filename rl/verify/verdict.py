"""The outcome of verifying one sample: what crosses from the verifier to
the rollouts, the store and the audit log."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from rl.verify.config import CHECKS


@dataclass
class Verdict:
    """The outcome of verifying one sample."""

    task_id: str
    reward: float
    checks: dict[str, float | None]
    """Each check's score in [0, 1]; None where a check does not apply."""
    passed: bool
    """Every test case passed."""
    cases: int = 0
    cases_passed: int = 0
    failure: str = ""
    """Why it did not pass: the first failing case, a load error, a limit."""
    events: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def sample_checks(self) -> dict[str, float]:
        """The checks as a rollout batch stores them (`rl.store.Sample.checks`):
        every check of the fixed vocabulary `CHECKS`, its score, or NaN where
        it does not apply to the task. Every verdict has the same keys, so
        samples of any mix of tasks share one batch."""
        scores = {name: self.checks.get(name) for name in CHECKS}
        return {name: math.nan if score is None else float(score) for name, score in scores.items()}
