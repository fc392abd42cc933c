"""Replay a trace (rl.tasks.traces) in its task's environment: the episode
loop of rollouts and `sarl eval`, with the trace's replies in place of the
model's samples. The environment makes the observations and grades the
final state, so a trace that replays to reward 1 is correct by the same
judge as a rollout, and its conversation is the one a rollout would have.

`check_traces` replays many, a warm sandbox each, on `parallel` threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rl.agent.config import AgentConfig
from rl.agent.tools import INVALID_CALLS
from rl.engine import Completion
from rl.engine.config import SamplingParams
from rl.episodes.episode import Episode, run_episode
from rl.tasks.format import Task
from rl.tasks.traces import Trace

MAX_MODEL_LEN = 16384
"""Room for a trace's whole conversation: a workspace trace writes its file in full."""


@dataclass(frozen=True)
class Replayed:
    """What a trace's replay gave."""

    task_id: str
    kind: str
    reward: float
    turns: int
    end: str
    invalid_calls: int
    failure: str
    """The verdict's failure, or why the replay did not end as the trace does."""
    tokens: list[int]
    """The episode's token ids, as a rollout stores them (rl.agent.tokens)."""
    loss_mask: list[int]
    """1 on the policy's tokens (the trace's replies), 0 on the prompt, the
    observations and the replies the trace leaves untrained."""

    @property
    def ok(self) -> bool:
        return self.reward == 1.0 and self.invalid_calls == 0 and not self.failure


def replay(task: Task, trace: Trace, tokenizer: Any, sandbox: Any, verifier: Any) -> Episode:
    """The trace's episode: each turn's reply is the trace's next one, ended
    by the model's end-of-message token, whatever the sampling asks."""
    end = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    if not isinstance(end[0], int) or end[0] == tokenizer.unk_token_id:
        end = [tokenizer.eos_token_id]
    replies: Iterator[str] = iter(trace.replies)

    def generate(prompt: list[int], params: SamplingParams) -> tuple[Completion, int]:
        ids = tokenizer.encode(next(replies), add_special_tokens=False) + end
        return Completion(ids, [0.0] * len(ids), "stop"), 0

    cfg = AgentConfig(max_turns=len(trace.replies), max_tokens=MAX_MODEL_LEN, temperature=1.0)
    return run_episode(task, cfg, generate, tokenizer, sandbox, verifier, MAX_MODEL_LEN, seed=0)


def untrain(loss_mask: list[int], replies: tuple[int, ...]) -> list[int]:
    """`loss_mask` with the given replies' tokens set to 0. A reply is a run of
    1s (its ids and its end token); observations and chat-template tokens,
    all 0, separate one reply from the next."""
    out, reply, prev = list(loss_mask), -1, 0
    for i, m in enumerate(loss_mask):
        reply += m and not prev
        if m and reply in replies:
            out[i] = 0
        prev = m
    return out


def check_traces(
    pairs: list[tuple[Task, Trace]], tokenizer: Any, sandbox_cfg: Any = None, parallel: int = 2
) -> list[Replayed]:
    """Replay each (task, trace); in the order given."""
    from rl.verify.config import VerifyConfig
    from rl.verify.verifier import Verifier
    from sandboxes.pool import WarmPool

    with (
        WarmPool(sandbox_cfg, size=parallel) as pool,
        Verifier(VerifyConfig(parallel=parallel), sandbox=sandbox_cfg) as verifier,
        ThreadPoolExecutor(parallel) as ex,
    ):

        def one(pair: tuple[Task, Trace]) -> Replayed:
            task, trace = pair
            sb = pool.take()
            try:
                ep = replay(task, trace, tokenizer, sb, verifier)
            except BaseException:
                sb.close()
                raise
            pool.give(sb)
            v = ep.verdict
            arrays = ep.trajectory.arrays()
            why = (
                "" if ep.turns == len(trace.replies) else f"ended at turn {ep.turns} of {len(trace.replies)} ({ep.end})"
            )
            return Replayed(
                task.task_id,
                trace.kind,
                float(v.reward) if v is not None else 0.0,
                ep.turns,
                ep.end,
                sum(ep.tool_failures[w] for w in INVALID_CALLS),
                why or (v.failure if v is not None and not v.passed else ""),
                arrays["tokens"].tolist(),
                untrain(arrays["loss_mask"].tolist(), trace.untrained),
            )

        return list(ex.map(one, pairs))
