"""A played group as store samples, and the failure vocabulary.

Every committed sample has a failure reason from POLICY_FAILURES, or ""
when it passed. Infrastructure failures (INFRA_FAILURES) never reach a
sample: the episode is played again, or its group is abandoned with the
reason in the worker's state, so that no infrastructure fault is trained
on as a reward of 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl.episodes.episode import Episode
from rl.store import Sample
from rl.tasks.format import Task

POLICY_FAILURES = ("wrong-answer", "no-code", "crash", "timeout", "limit", "deadline", "token-budget", "verifier")
"""Why a scored episode did not pass; its reward stands and it is trained on.
`verifier`: the verifier could not judge it (reward 0, counted apart)."""
INFRA_FAILURES = ("no-generator", "sandbox", "environment")
"""Why an episode could not be played; retried (an environment's own error
is not: its group is given up at once), never trained on."""


def failure_of(ep: Episode) -> str:
    """The reason from the fixed vocabulary, empty when the episode passed."""
    v = ep.verdict
    if v is None or v.failure.startswith("verifier error"):
        return "verifier"
    if v.passed:
        return ""
    if not ep.completion.strip():
        return "no-code"
    if ep.end in ("deadline", "token-budget"):
        return ep.end
    why = v.failure
    if why.startswith("limit hit"):
        return "limit"
    if "timeout" in why:
        return "timeout"
    if "did not load" in why or "crash" in why or "Error" in why:
        return "crash"
    return "wrong-answer"


def agent_shares(samples: int, crashes: int, reached_turn_2: int, fixed: int) -> dict[str, float | None]:
    """What the agent does with its turns, the same figures for rollouts
    (TensorBoard) and evaluations (`sarl eval`): the share of samples whose
    code crashed, the share that reached a second turn (the first attempt
    failed a visible example and was shown why), and the share of those that
    passed in the end (None when none reached it)."""
    n = max(1, samples)
    return {
        "crash_share": round(crashes / n, 4),
        "turn_2_share": round(reached_turn_2 / n, 4),
        "turn_2_fix_rate": round(fixed / reached_turn_2, 4) if reached_turn_2 else None,
    }


@dataclass
class GroupResult:
    """The `group_size` episodes of one group, all played."""

    group: int
    task: Task
    episodes: list[Episode]


def to_samples(result: GroupResult) -> list[Sample]:
    """Each episode's samples: one, or more for a harness episode whose
    rendered prompts drifted from its sampled ids, all with its reward."""
    out = []
    for ep in result.episodes:
        for traj, temperature in [(ep.trajectory, ep.temperature), *ep.more]:
            a = traj.arrays()
            sampled = a["versions"][a["versions"] >= 0]
            out.append(
                Sample(
                    task_id=result.task.task_id,
                    group_id=result.group,
                    policy_version=int(sampled.min()) if sampled.size else 0,
                    tokens=a["tokens"],
                    loss_mask=a["loss_mask"],
                    logprobs=a["logprobs"],
                    reward=float(ep.verdict.reward) if ep.verdict is not None else 0.0,
                    checks=ep.verdict.sample_checks(),
                    timings={k: round(v, 4) for k, v in ep.timings.items()},
                    failure=failure_of(ep),
                    versions=a["versions"],
                    episode_id=ep.episode_id,
                    temperature=temperature,
                    retokenized=ep.retokenized,
                )
            )
    return out
