"""One episode: the policy against its environment, then verification.

    environment.reset -> prompt ids -> generate -> environment.step(reply)
    -> observation ids -> generate -> ... -> environment.final()
    -> environment.verify (a fresh sandbox, pristine checks) -> reward

The environment (rl.agent.env) is the task's kind or the configured one:
the same loop plays function tasks, workspace tasks with tools, and a
user's `module:Class`, for rollouts and `sarl eval` alike. The loop owns
the tokens: the environment sees text, and its observations are appended
after the sampled ids without re-tokenising them (rl.agent.tokens), so the
trajectory holds every id exactly as sampled.

An episode ends when the environment says so (examples pass, submit), after
`max_turns` replies, when the next turn would not fit in `max_model_len`,
or at its deadline: checked before each reply, and what the environment
runs is cut at the deadline (a reply being generated is bounded by the
generator client's timeout, not by the deadline). An environment that
raises is an infrastructure failure (EnvironmentFailed), never a score.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl.agent.config import AgentConfig, EnvironmentSpecError, load_environment
from rl.agent.env import EnvContext, EnvironmentFailed, Final
from rl.agent.tokens import ObservationTokens, Trajectory
from rl.agent.tools import with_tools
from rl.engine import Completion
from rl.engine.config import SamplingParams
from rl.model import chat_ids, stop_ids
from rl.tasks.format import Task

Generate = Callable[[list[int], SamplingParams], tuple[Completion, int]]
"""Sample one completion of a prompt: (the completion, the weight version that sampled it)."""

ENDS = ("examples-pass", "submitted", "max-turns", "token-budget", "deadline", "exited")
"""`exited`: a harness episode's program ended by itself (rl.rollout.harness)."""


@dataclass
class Episode:
    """An episode's trajectory and how it went."""

    trajectory: Trajectory
    completion: str
    """The final answer as text (a function: the completion of the task's
    prompt the verifier got; a workspace: the diff of its files)."""
    turns: int
    end: str
    """Why it ended: one of ENDS."""
    verdict: Any = None
    """The verifier's Verdict of the final answer."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent: generate_s, execute_s (the environment's steps), verify_s."""
    outcomes: list[Any] = field(default_factory=list)
    """The environment's record of each step (function: each run of the
    policy's code with the visible examples)."""
    episode_id: str = ""
    """Its identity in the run, `GROUP/INDEX`, set by the rollout worker."""
    temperature: float = 1.0
    """The temperature every reply was sampled at (0: greedy)."""
    tool_calls: int = 0
    """Tool calls the policy made, valid or not."""
    tool_failures: Counter[str] = field(default_factory=Counter)
    """How many of each failure (rl.agent.tools.TOOL_FAILURES) its calls met."""
    more: list[tuple[Trajectory, float]] = field(default_factory=list)
    """Further samples of the episode, each with its temperature: a harness
    episode's calls whose rendered prompts did not extend the ids sampled
    before (rl.gateway.capture). Native episodes have none."""
    retokenized: int = 0
    """How many of its calls began a sample of their own that way."""


def _guard(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call an environment method; what it raises is the environment's failure."""
    from rl.serving.client import NoGenerator
    from sandboxes import SandboxError

    try:
        return fn(*args)
    except (SandboxError, NoGenerator, EnvironmentFailed):
        raise
    except Exception as e:  # noqa: BLE001 (any error of an environment is not the policy's)
        raise EnvironmentFailed(f"{what} raised {type(e).__name__}: {str(e)[:300]}") from e


def run_episode(
    task: Task,
    cfg: AgentConfig,
    generate: Generate,
    tokenizer: Any,
    sandbox: Any,
    verifier: Any,
    max_model_len: int,
    deadline: float | None = None,
    seed: int | None = None,
    waited: Callable[[], float] | None = None,
) -> Episode:
    """Play one episode of `task` and verify its final answer. `deadline`
    is a `time.monotonic()` value; `seed` seeds each reply (turn k: seed + k).
    `waited()`: the seconds the episode has spent so far waiting for a
    generator (none announced yet, no free slot, not yet on the round's
    version). They are not the policy's time: the deadline moves by them, so
    that a queued or restarting generator never ends an episode as `deadline`,
    a policy failure that would be scored."""

    def left() -> float:
        if deadline is None:
            return float("inf")
        return deadline + (waited() if waited is not None else 0.0) - time.monotonic()

    kind, env, start = start_environment(task, cfg, sandbox, verifier, left, tokenizer)
    messages, schemas, role = with_tools(list(start.messages), [t.schema() for t in start.tools], tokenizer)
    obs = ObservationTokens(tokenizer)
    traj = Trajectory.start(chat_ids(tokenizer, messages, tools=schemas))
    timings = {"generate_s": 0.0, "execute_s": 0.0, "verify_s": 0.0}
    end, turns, outcomes, calls, failures = "max-turns", 0, [], 0, Counter[str]()
    stops = stop_ids(tokenizer)
    while True:
        room = max_model_len - len(traj)
        if room < 2:
            end = "token-budget"
            break
        if left() <= 0:
            end = "deadline"
            break
        params = SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=min(cfg.max_tokens, room),
            stop_token_ids=stops,
            seed=None if seed is None else seed + turns,
        )
        t0 = time.monotonic()
        completion, version = generate(traj.tokens, params)
        timings["generate_s"] += time.monotonic() - t0
        traj.add_sampled(list(completion.token_ids), list(completion.logprobs), version)
        turns += 1
        reply = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        t0 = time.monotonic()
        step = _guard(f"{kind}.step", env.step, reply, turns >= cfg.max_turns)
        timings["execute_s"] += time.monotonic() - t0
        calls += step.calls
        failures.update(step.failures)
        if step.outcome is not None:
            outcomes.append(step.outcome)
        if step.done or turns >= cfg.max_turns:
            end = step.end if step.done and step.end in ENDS else "max-turns"
            break
        if left() <= 0:
            end = "deadline"
            break
        ids = obs.after_reply(list(completion.token_ids), step.observation, role)
        if len(traj) + len(ids) + 1 >= max_model_len:
            end = "token-budget"
            break
        traj.add_context(ids)
    final = _guard(f"{kind}.final", env.final)
    if not isinstance(final, Final):
        raise EnvironmentFailed(f"{kind}.final returned {type(final).__name__}, not a Final")
    t0 = time.monotonic()
    verdict = _verdict(task, _guard(f"{kind}.verify", env.verify, final), verifier, kind)
    timings["verify_s"] = time.monotonic() - t0
    return Episode(
        traj,
        final.completion,
        turns,
        end,
        verdict,
        timings,
        outcomes,
        temperature=cfg.temperature,
        tool_calls=calls,
        tool_failures=failures,
    )


def start_environment(
    task: Task, cfg: AgentConfig, sandbox: Any, verifier: Any, left: Callable[[], float], tokenizer: Any
) -> tuple[str, Any, Any]:
    """The task's environment (its kind, or the configured one), reset for
    the task: (its kind, it, its Start). Its failures are EnvironmentFailed."""
    kind = cfg.environment or task.environment
    try:
        cls = load_environment(kind)
    except EnvironmentSpecError as e:
        raise EnvironmentFailed(str(e)) from None
    env = _guard(f"{kind}(ctx)", cls, EnvContext(task, sandbox, verifier, cfg, left, tokenizer))
    return kind, env, _guard(f"{kind}.reset", env.reset, task)


def _verdict(task: Task, got: Any, verifier: Any, kind: str) -> Any:
    """A Verdict as it is, or one made of a mapping of check scores."""
    from rl.verify.verdict import Verdict

    if isinstance(got, Verdict):
        return got
    if not isinstance(got, dict):
        raise EnvironmentFailed(f"{kind}.verify returned {type(got).__name__}, not a Verdict or a dict of checks")
    try:
        return verifier.verdict_of_checks(task, got)
    except ValueError as e:
        raise EnvironmentFailed(f"{kind}.verify: {e}") from None
