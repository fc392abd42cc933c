"""A harness episode: the user's own agent program plays the task.

    environment.reset (the task's files in the work dir)
    -> the program, in the sandbox, calls the endpoint with its episode's key
    -> it exits, or the deadline cuts it -> environment.final()
    -> environment.verify (a fresh sandbox, pristine checks) -> reward
    -> the session's calls, assembled into samples (rl.gateway.capture)

The program reaches the gateway of its rollout worker (rl.gateway.server)
through the sandbox's network allow-list, which holds that one address:
inside, `127.0.0.1:PORT` is relayed to the gateway and nothing else is
reachable. Its key is its episode's alone, and dies with the episode: a
leftover process of an earlier attempt cannot add calls to a later one.

Everything else is as for a native episode (rl.episodes.episode): a call
the endpoint could not serve (no generator, an engine error) makes the
episode an infrastructure failure, retried and never scored, whatever the
program did with the error; the worker commits the episode exactly once.
A native episode's deadline moves by the time spent waiting for a
generator; a program's wall-time limit is set when it starts and cannot.
So a program cut by the deadline after its calls waited for a generator
(more than 1 s and a twentieth of its time) is an infrastructure failure
too: retried, never scored as the policy's `deadline`. Not covered: a call
still waiting when the deadline comes is not counted (the endpoint learns
how long it waited only when it is answered).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from rl.agent.config import AgentConfig
from rl.agent.tokens import Trajectory
from rl.episodes.episode import Episode, _guard, _verdict, start_environment
from rl.model import chat_ids
from rl.tasks.format import Task


class EndpointFailed(RuntimeError):
    """A call of the episode failed on the endpoint's side: not the policy's."""


def run_harness(
    task: Task,
    cfg: AgentConfig,
    gateway: Any,
    tokenizer: Any,
    sandbox: Any,
    verifier: Any,
    deadline: float | None,
    seed: int,
    episode_id: str,
) -> Episode:
    assert cfg.harness is not None and gateway.sessions is not None

    def left() -> float:
        return float("inf") if deadline is None else deadline - time.monotonic()

    kind, env, start = start_environment(task, cfg, sandbox, verifier, left, tokenizer)
    for name, path in cfg.harness.files.items():
        sandbox.write_file(name, path.read_bytes())
    result, run_s, session = _run_program(cfg, gateway, sandbox, start.messages, seed, episode_id, deadline, left)
    timings = {"generate_s": session.generate_s, "execute_s": max(0.0, run_s - session.generate_s), "verify_s": 0.0}
    end = "deadline" if result.limit == "wall_time" or left() <= 0 else "exited"
    if end == "deadline" and session.waited_s > max(1.0, 0.05 * run_s):
        why = f"the deadline cut the program after its calls waited {session.waited_s:.1f} s for a generator"
        raise EndpointFailed(why)
    final = _guard(f"{kind}.final", env.final)
    t1 = time.monotonic()
    verdict = _verdict(task, _guard(f"{kind}.verify", env.verify, final), verifier, kind)
    timings["verify_s"] = time.monotonic() - t1
    got = session.assembled()
    if got.samples:
        first, temperature = got.samples[0], got.temperatures[0]
    else:  # the program never called: its reward counts, with no token to train on
        first, temperature = Trajectory.start(chat_ids(tokenizer, list(start.messages))), cfg.temperature
    stderr = result.stderr[-2000:].decode(errors="replace")
    outcome = {"exit_code": result.exit_code, "limit": result.limit, "stderr": stderr}
    return Episode(
        trajectory=first,
        completion=final.completion,
        turns=got.calls,
        end=end,
        verdict=verdict,
        timings=timings,
        outcomes=[outcome],
        temperature=temperature,
        more=list(zip(got.samples[1:], got.temperatures[1:], strict=True)),
        retokenized=got.mismatches,
    )


def _run_program(
    cfg: AgentConfig,
    gateway: Any,
    sandbox: Any,
    messages: list[dict[str, Any]],
    seed: int,
    episode_id: str,
    deadline: float | None,
    left: Callable[[], float],
) -> tuple[Any, float, Any]:
    """The program run under a gateway session of its own (a new key for each
    attempt): its result, its seconds, and the session with its calls. A
    call that failed at the endpoint fails the attempt, not the policy."""
    assert cfg.harness is not None
    session = gateway.sessions.open(f"{episode_id}~{secrets.token_hex(4)}", cfg.harness.max_calls)
    try:
        t0 = time.monotonic()
        result = sandbox.exec(
            list(cfg.harness.command),
            env=_environment(cfg, gateway, session.key, messages, seed),
            limits=_limits(sandbox, max(1.0, left())) if deadline is not None else sandbox.cfg.limits,
        )
        run_s = time.monotonic() - t0
    finally:
        gateway.sessions.close(session.id)
    if session.infra:
        raise EndpointFailed(f"{len(session.infra)} call(s) failed at the endpoint: {session.infra[0]}")
    return result, run_s, session


def _environment(cfg: AgentConfig, gateway: Any, key: str, messages: list[dict[str, Any]], seed: int) -> dict[str, str]:
    user = next((m["content"] for m in messages if m.get("role") == "user"), "")
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    return {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{gateway.port}/v1",
        "OPENAI_API_KEY": key,
        "OPENAI_MODEL": gateway.model,
        "SARL_TASK": str(user),
        "SARL_SYSTEM": str(system),
        "SARL_SEED": str(seed),
        "SARL_MAX_TOKENS": str(cfg.max_tokens),
        "SARL_TEMPERATURE": str(cfg.temperature),
        "SARL_MAX_TURNS": str(cfg.max_turns),
    }


def _limits(sandbox: Any, wall_s: float) -> Any:
    """The sandbox's own limits, with the wall time the episode has left."""
    base = sandbox.cfg.limits
    return base.model_copy(update={"wall_s": wall_s, "cpu_s": max(base.cpu_s, wall_s)})
