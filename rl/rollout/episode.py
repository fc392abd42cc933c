"""One episode: think, execute, observe, revise; then verify.

    prompt ids -> generate -> parse the action -> run it with the visible
    examples in the episode's sandbox -> observation ids -> generate -> ...
    -> the last code the policy wrote -> verifier, in a fresh sandbox with
    the pristine hidden tests -> reward

An episode ends when its code passes every visible example (if configured),
after `max_turns` replies, when the next turn would not fit in
`max_model_len`, or at its deadline: checked before each reply, and a run
of the policy's code is cut at the deadline (a reply being generated is
bounded by the generator client's timeout, not by the deadline). The trajectory (rl.agent.tokens) holds
every id exactly as sampled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl.agent.actions import as_completion, parse_action
from rl.agent.config import AgentConfig
from rl.agent.observe import Outcome, describe, fit, run_action
from rl.agent.prompts import first_messages
from rl.agent.tokens import ObservationTokens, Trajectory
from rl.engine import Completion
from rl.engine.config import SamplingParams
from rl.model import chat_ids, stop_ids
from rl.tasks.format import Task

Generate = Callable[[list[int], SamplingParams], tuple[Completion, int]]
"""Sample one completion of a prompt: (the completion, the weight version that sampled it)."""

ENDS = ("examples-pass", "max-turns", "token-budget", "deadline")


@dataclass
class Episode:
    """An episode's trajectory and how it went."""

    trajectory: Trajectory
    completion: str
    """The final solution, as a completion of the task's prompt (what the verifier got)."""
    turns: int
    end: str
    """Why it ended: one of ENDS."""
    verdict: Any = None
    """The verifier's Verdict of `completion`."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent: generate_s, execute_s, verify_s."""
    outcomes: list[Outcome] = field(default_factory=list)
    """Each run of the policy's code with the visible examples."""
    episode_id: str = ""
    """Its identity in the run, `GROUP/INDEX`, set by the rollout worker."""
    temperature: float = 1.0
    """The temperature every reply was sampled at (0: greedy)."""


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
    """Play one episode of `task` and verify its final solution. `deadline`
    is a `time.monotonic()` value; `seed` seeds each reply (turn k: seed + k).
    `waited()`: the seconds the episode has spent so far waiting for a
    generator (none announced yet, no free slot, not yet on the round's
    version). They are not the policy's time: the deadline moves by them, so
    that a queued or restarting generator never ends an episode as `deadline`,
    a policy failure that would be scored."""

    def left() -> float:
        assert deadline is not None
        return deadline + (waited() if waited is not None else 0.0) - time.monotonic()

    obs = ObservationTokens(tokenizer)
    traj = Trajectory.start(chat_ids(tokenizer, first_messages(task, cfg)))
    timings = {"generate_s": 0.0, "execute_s": 0.0, "verify_s": 0.0}
    code, end, turns, outcomes = "", "max-turns", 0, []
    for path, content in task.files.items():
        sandbox.write_file(f"/sandbox/{path}", content)
    stops = stop_ids(tokenizer)
    while True:
        room = max_model_len - len(traj)
        if room < 2:
            end = "token-budget"
            break
        if deadline is not None and left() <= 0:
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
        action = parse_action(tokenizer.decode(completion.token_ids, skip_special_tokens=True))
        if action.code:
            code = action.code
        if turns >= cfg.max_turns:
            end = "max-turns"
            break
        t0 = time.monotonic()
        # a run may take `run_s`, and never past the episode's deadline
        run_s = cfg.run_s if deadline is None else max(0.05, min(cfg.run_s, left()))
        outcome = run_action(sandbox, task, action.code, run_s) if action.code else Outcome()
        timings["execute_s"] += time.monotonic() - t0
        outcomes.append(outcome)
        if deadline is not None and run_s < cfg.run_s and outcome.limit == "wall_time":
            end = "deadline"
            break
        if action.code and outcome.all_pass and cfg.stop_when_examples_pass:
            end = "examples-pass"
            break
        text = fit(describe(outcome, bool(action.code)), tokenizer, cfg.observation_tokens)
        ids = obs.after_reply(list(completion.token_ids), text)
        if len(traj) + len(ids) + 1 >= max_model_len:
            end = "token-budget"
            break
        traj.add_context(ids)
    solution = as_completion(task.prompt, code)
    t0 = time.monotonic()
    verdict = verifier.verify(task, solution)
    timings["verify_s"] = time.monotonic() - t0
    return Episode(traj, solution, turns, end, verdict, timings, outcomes, temperature=cfg.temperature)
