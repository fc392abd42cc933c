"""The environment interface: what an episode runs against.

An environment gives the first messages and the tools, takes each reply of
the policy, answers with an observation, and at the end says what is
verified. Every built-in kind (`function`, `workspace`) is written against
it, and so is a user's own `module:Class` (docs/environments.md,
examples/echo_env.py). One instance plays one episode:

    env = Env(EnvContext(task, sandbox, verifier, agent, time_left))
    start = env.reset(task)          -> Start(messages, tools)
    step  = env.step(reply, last)    -> Step(observation, done, end, failures)   (per reply)
    final = env.final()              -> Final(completion, files)
    env.verify(final)                -> a Verdict, or {check: score in [0, 1]}

The episode loop (rl.episodes.episode) owns the tokens: the environment sees
and returns text only, so it can never change an id that was sampled. An
exception raised by an environment is an infrastructure failure
(`EnvironmentFailed`): the episode is never scored, never trained on as a
reward of 0, and its reason is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl.agent.config import AgentConfig
from rl.agent.tools import Tool
from rl.tasks.format import Task


class EnvironmentFailed(RuntimeError):
    """An environment raised, or broke its contract: the episode cannot be
    scored. The message says which method and why."""


@dataclass
class EnvContext:
    """What an environment may use during its episode."""

    task: Task
    sandbox: Any
    """The episode's own sandbox (sandboxes.Sandbox): what the policy does runs here."""
    verifier: Any
    """The verifier (rl.verify.verifier.Verifier): grades in a fresh sandbox."""
    agent: AgentConfig
    """Turn and budget settings (`[agent]`)."""
    time_left: Callable[[], float] = lambda: float("inf")
    """Seconds left before the episode's deadline (inf without one): a
    command the environment runs must not outlive it."""
    tokenizer: Any = None
    """The policy's tokenizer, to cut observations to a token budget."""


@dataclass
class Start:
    """The start of an episode."""

    messages: list[dict[str, str]]
    """The first messages (system, user), rendered by the one chat template."""
    tools: list[Tool] = field(default_factory=list)
    """Tools offered to the policy (none: the reply itself is the action)."""


@dataclass
class Step:
    """What one reply of the policy led to."""

    observation: str = ""
    """Text shown to the policy before its next reply ("" when done)."""
    done: bool = False
    """The episode ends after this reply."""
    end: str = ""
    """Why it ended, when `done` (e.g. `submitted`, `examples-pass`)."""
    failures: list[str] = field(default_factory=list)
    """Tool-call failures of this reply, from rl.agent.tools.TOOL_FAILURES."""
    calls: int = 0
    """Tool calls the reply made (valid or not)."""
    outcome: Any = None
    """The environment's own record of the step (the function kind: its
    rl.agent.observe.Outcome), kept on the Episode."""


@dataclass
class Final:
    """What the episode leaves to be verified."""

    completion: str = ""
    """The answer as text: for a function, the completion of the prompt; for
    a workspace, the diff of its files. Empty: the policy gave nothing."""
    files: dict[str, str] | None = None
    """The final files of the episode's work dir, by relative path (None:
    not a file-based environment)."""


class Environment:
    """Base class of environments (subclass it, or match its methods)."""

    def __init__(self, ctx: EnvContext):
        self.ctx = ctx

    def reset(self, task: Task) -> Start:
        """The first messages and tools; may prepare the sandbox."""
        raise NotImplementedError

    def step(self, reply: str, last: bool) -> Step:
        """React to one reply (its text, decoded from the sampled ids).
        `last`: no further reply will come, so work done only to build the
        observation may be skipped."""
        raise NotImplementedError

    def final(self) -> Final:
        """What is verified."""
        raise NotImplementedError

    def verify(self, final: Final) -> Any:
        """Grade `final`: a rl.verify.verdict.Verdict, or a mapping of check
        name to a score in [0, 1] (the reward aggregates them with
        `verify.weights`; unknown names are refused)."""
        raise NotImplementedError
