"""The `[agent]` section: the protocol, its budgets, and the environment
(pydantic and the standard library only).

Which environment plays a task: the task names its kind
(`Task.environment`, default `function`); `environment`, when not empty,
plays every task with one kind or a user's own class. A `module:Class` is
imported and its methods' signatures checked when the config is read, so
that a missing module, a missing class or a wrong signature is an error
before anything is submitted.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

from pydantic import Field, field_validator

from rl.engine.config import Temperature, TopP
from rl.schema import Section

BUILTIN_ENVIRONMENTS = {
    "function": "rl.agent.function:FunctionEnv",
    "workspace": "rl.agent.workspace:WorkspaceEnv",
    "sql": "rl.agent.sql:SQLEnv",
    "node": "rl.agent.node:NodeEnv",
    "text": "rl.agent.text:TextEnv",
}
"""The built-in kinds, by the name a task or config gives."""

SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

# method: the parameters it takes after self
METHODS = {"reset": ("task",), "step": ("reply", "last"), "final": (), "verify": ("final",)}


class EnvironmentSpecError(ValueError):
    """An environment name that cannot be used; the message says why."""


def load_environment(spec: str) -> type:
    """The class a built-in name or `module:Class` names, checked."""
    target = BUILTIN_ENVIRONMENTS.get(spec, spec)
    if not SPEC.match(target):
        raise EnvironmentSpecError(
            f"{spec!r} is neither a built-in environment ({', '.join(BUILTIN_ENVIRONMENTS)}) nor `module:Class`"
        )
    module, _, name = target.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:  # a user's module next to the config
        sys.path.append(str(Path.cwd()))
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise EnvironmentSpecError(f"{spec!r}: module {module!r} cannot be imported: {e}") from None
    except Exception as e:  # noqa: BLE001 (an error at import is the user's, reported as such)
        raise EnvironmentSpecError(f"{spec!r}: importing {module!r} raised {type(e).__name__}: {e}") from None
    cls = getattr(mod, name, None)
    if not inspect.isclass(cls):
        raise EnvironmentSpecError(f"{spec!r}: module {module!r} has no class {name!r}")
    check_environment(cls, spec)
    return cls


def check_environment(cls: type, spec: str) -> None:
    """Refuse a class whose methods do not match the interface (rl.agent.env)."""
    try:
        inspect.signature(cls).bind(object())
    except TypeError:
        raise EnvironmentSpecError(f"{spec!r}: {cls.__name__}(ctx) must take one argument, the EnvContext") from None
    for method, params in METHODS.items():
        fn = getattr(cls, method, None)
        if not callable(fn):
            raise EnvironmentSpecError(f"{spec!r}: {cls.__name__} has no method {method}({', '.join(params)})")
        try:
            inspect.signature(fn).bind(object(), *params)
        except TypeError:
            raise EnvironmentSpecError(
                f"{spec!r}: {cls.__name__}.{method} must take ({', '.join(('self', *params))}); "
                f"it is {method}{inspect.signature(fn)}"
            ) from None
        if inspect.iscoroutinefunction(fn):
            raise EnvironmentSpecError(f"{spec!r}: {cls.__name__}.{method} must be a plain method, not async")


SYSTEM_PROMPT = (
    "You are a careful Python programmer. Solve the task by writing the whole function "
    "in one ```python code block.\n"
    "After each reply, your code is run with the examples from the task, and you see what it "
    "printed and which examples failed.\n"
    "If an example fails, reply with a corrected ```python code block. When every example passes, "
    "your last code block is your answer."
)


class HarnessConfig(Section):
    """Your own agent program plays each episode (docs/endpoint.md): it runs
    in the episode's sandbox, in the work dir that holds the task's files,
    and calls the policy through the OpenAI API at `OPENAI_BASE_URL` with
    `OPENAI_API_KEY`, a key scoped to its episode (`OPENAI_MODEL` names the
    model). The task is in `SARL_TASK` (its first user message) and
    `SARL_SYSTEM`; `SARL_SEED`, `SARL_MAX_TOKENS`, `SARL_TEMPERATURE` and
    `SARL_MAX_TURNS` carry the agent's settings for a program that wants them.
    When it exits, or at the episode's deadline, the work dir is verified as
    the task's environment verifies it; the sandbox reaches the endpoint and
    nothing else."""

    command: list[str] = Field(min_length=1)
    """The program's command line, run in the work dir (`["python3", "agent.py"]`)."""
    files: dict[str, Path] = Field(default_factory=dict)
    """Files copied into the work dir before it runs: name there -> a file here."""
    max_calls: int = Field(32, ge=1, le=10_000)
    """Calls one episode may make to the endpoint; later ones are answered
    429 (`rate_limit_error`): a program in a loop cannot hold the generators."""

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, Path]) -> dict[str, Path]:
        for name in v:
            if not name or name.startswith("/") or ".." in Path(name).parts:
                raise ValueError(f"{name!r}: a name inside the work dir (relative, without '..')")
        return v  # each file is found relative to the config's folder (rl.config)


class AgentConfig(Section):
    """How an episode talks to the policy: prompts, turns and budgets."""

    system_prompt: str = SYSTEM_PROMPT
    """The system message: it explains the protocol (one ```python block per reply)."""
    max_turns: int = Field(3, ge=1, le=32)
    """Replies the policy may give; 1 is plain single-turn RL."""
    max_tokens: int = Field(384, ge=8)
    """Tokens the policy may sample per reply."""
    temperature: Temperature = 0.8
    """Sampling temperature of each reply: 0 (greedy), or between 0.01 and 100."""
    top_p: TopP = 1.0
    """Nucleus sampling mass, between 1e-6 and 1."""
    observation_tokens: int = Field(256, ge=16)
    """Tokens an observation may take at most; longer output is cut in the middle."""
    stop_when_examples_pass: bool = True
    """End the episode as soon as the code passes every visible example."""
    run_s: float = Field(5.0, gt=0)
    """Seconds one run of the policy's code with the examples, or one tool
    call, may take."""
    max_tool_calls: int = Field(4, ge=1, le=32)
    """Tool calls of one reply that are run; later ones are ignored."""
    environment: str = ""
    """The environment that plays every task: a built-in kind (`function`,
    `workspace`, `sql`, `node`) or your own `module:Class` (docs/environments.md). Empty:
    each task's own `environment`."""

    harness: HarnessConfig | None = None
    """An agent program of your own plays each episode through the OpenAI
    API, instead of sarl's turn loop (`[rollout.agent.harness]`). Its
    environment's tools are not offered: the program brings its own."""

    @field_validator("environment")
    @classmethod
    def _environment(cls, v: str) -> str:
        if v:
            load_environment(v)  # imported and its signatures checked now, before anything is submitted
        return v
