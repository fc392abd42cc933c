"""The run configuration: one schema, read from TOML, validated once.

A run is described by one TOML file. Each section is a typed model whose
fields carry their documentation (`sarl config show --doc` prints it). Unknown
keys, wrong types and impossible combinations are `ConfigError`s that name the
file and the dotted key, raised before anything is submitted.

Fields marked `mid_run_safe` may differ between the frozen `run.toml` of a
run directory and a later `sarl submit` / `sarl resume --set`: they change how
jobs are scheduled, not what the run computes. Any other difference is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.json_schema import JsonDict

from rl.engine.config import EngineConfig, ModelConfig, VLLMEngineConfig
from rl.verify_config import VerifyConfig
from sandboxes.config import SandboxConfig

__all__ = [
    "Config",
    "ConfigError",
    "JobResources",
    "LocalExecutor",
    "SlurmExecutor",
    "GeneratorRole",
    "SmokeRole",
    "ValidateRole",
    "config_diff",
    "dump_toml",
    "load_config",
    "parse_overrides",
    "unsafe_changes",
]

SAFE: JsonDict = {"mid_run_safe": True}


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the file and key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


# --------------------------------------------------------------------- executors


class LocalExecutor(_Model):
    """Run each job as a local process on this machine, through submitit."""

    type: Literal["local"] = "local"
    """Backend tag: `local` runs jobs as detached processes on this machine."""


class SlurmExecutor(_Model):
    """Submit each role as a Slurm job or job array, through submitit."""

    type: Literal["slurm"] = "slurm"
    """Backend tag: `slurm` submits with sbatch."""
    partition: str | None = Field(None, json_schema_extra=SAFE)
    """Default partition of every role (a role's `job.partition` overrides it)."""
    account: str | None = Field(None, json_schema_extra=SAFE)
    """Slurm account to charge (`--account`)."""
    qos: str | None = Field(None, json_schema_extra=SAFE)
    """Quality of service (`--qos`)."""
    signal_delay_s: int = Field(120, ge=10, json_schema_extra=SAFE)
    """Seconds before the time limit at which Slurm sends USR2 so that a job can
    checkpoint and requeue itself. Slurm may send it up to about 60 s early."""
    max_timeouts: int = Field(1000, ge=0, json_schema_extra=SAFE)
    """How many times a job may hit its time limit and requeue itself before it
    counts as failed. Preemptions do not use this up."""
    setup: list[str] = Field(default_factory=list, json_schema_extra=SAFE)
    """Shell lines run at the start of every job script (e.g. `module load cuda`)."""
    extra_sbatch: dict[str, str | int | bool] = Field(default_factory=dict, json_schema_extra=SAFE)
    """Additional sbatch options, without the leading dashes (`{constraint = "a100"}`)."""


Executor = Annotated[LocalExecutor | SlurmExecutor, Field(discriminator="type")]


# ---------------------------------------------------------------------- roles


class JobResources(_Model):
    """What one task of a role asks the scheduler for."""

    partition: str | None = Field(None, json_schema_extra=SAFE)
    """Partition for this role; defaults to `executor.partition`."""
    time_min: int = Field(60, ge=1, json_schema_extra=SAFE)
    """Time limit of one job, in minutes. A role that reaches it checkpoints and
    requeues itself."""
    nodes: int = Field(1, ge=1, json_schema_extra=SAFE)
    """Nodes per task (multi-node only for the learner)."""
    cpus_per_task: int = Field(1, ge=1, json_schema_extra=SAFE)
    """CPU cores per task."""
    gpus_per_task: int = Field(0, ge=0, json_schema_extra=SAFE)
    """GPUs per task (`--gpus-per-node` on Slurm)."""
    mem_gb: float = Field(2.0, gt=0, json_schema_extra=SAFE)
    """Memory per task, in GiB."""
    array_parallelism: int | None = Field(None, ge=1, json_schema_extra=SAFE)
    """At most this many tasks of the array run at once (`--array=...%N`);
    none: no limit. The local executor enforces it with slot locks."""


class RoleConfig(_Model):
    """Fields shared by every role."""

    tasks: int = Field(1, ge=1, le=100_000)
    """Number of tasks in the role's job array."""
    job: JobResources = JobResources()
    """Scheduler resources of each task."""


class SmokeRole(RoleConfig):
    """A plumbing check: each task counts `steps` steps of `step_s` seconds,
    committing its progress to the run directory after every step. It
    exercises submission, status, preemption, requeue and resume on a cluster
    without any model."""

    tasks: int = Field(8, ge=1, le=100_000)
    """Number of tasks in the smoke array."""
    steps: int = Field(10, ge=1)
    """Steps each task counts before it completes."""
    step_s: float = Field(1.0, ge=0, json_schema_extra=SAFE)
    """Seconds each step takes."""
    fail_tasks: list[int] = Field(default_factory=list, json_schema_extra=SAFE)
    """Tasks that raise an error half-way, to check how failures are reported
    (clear it with `sarl resume RUN_DIR --set smoke.fail_tasks=[]`)."""


class ValidateRole(RoleConfig):
    """Task validation as a job array: each array task validates every
    `tasks`-th task of `tasks_file`; `sarl tasks report RUN_DIR` merges."""

    tasks: int = Field(4, ge=1, le=100_000)
    """Number of array tasks (shards)."""
    tasks_file: Path
    """JSONL task file to validate. A relative path is resolved against the
    directory `sarl submit` runs in."""
    repeats: int = Field(3, ge=1)
    """Runs of each reference; results must agree (else flaky)."""


class GeneratorRole(RoleConfig):
    """Generators: each task serves the policy over HTTP (token ids in and
    out), announces itself in `endpoints/`, and loads every new weight
    version from the store without restarting."""

    tasks: int = Field(1, ge=1, le=10_000)
    """Number of generators."""
    engine: EngineConfig = Field(default_factory=VLLMEngineConfig)
    """Inference backend: `vllm` or `hf`, with its settings."""
    bind: str = "0.0.0.0"
    """Address the HTTP service listens on."""
    port: int = Field(0, ge=0, le=65535)
    """0: any free port; else task N listens on `port + N`."""
    poll_s: float = Field(2.0, gt=0, json_schema_extra=SAFE)
    """Seconds between looks for a new weight version (and announcements)."""
    max_queue: int = Field(256, ge=1, json_schema_extra=SAFE)
    """Requests queued at most; beyond it the service answers 503 (back-pressure)."""
    max_batch: int = Field(64, ge=1, json_schema_extra=SAFE)
    """Completions in the engine at once at most: sequences in flight (vLLM,
    continuous batching), or the size of one `generate` batch (HF)."""
    serve_s: float | None = Field(None, gt=0, json_schema_extra=SAFE)
    """Stop serving after this many seconds (none: until cancelled)."""


ROLE_TYPES: dict[str, type[RoleConfig]] = {
    "smoke": SmokeRole,
    "validation": ValidateRole,
    "generator": GeneratorRole,
}


# ---------------------------------------------------------------------- run


class RunSection(_Model):
    """Identity and location of the run."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    """Name of the run; its directory is `<root>/<name>`."""
    root: Path = Path("runs")
    """Folder that holds run directories, on the shared filesystem. A relative
    path is resolved against the directory `sarl submit` runs in."""
    seed: int = 0
    """Seed of every random choice of the run."""


class Config(_Model):
    """A whole run: its identity, where jobs run, and its roles."""

    run: RunSection
    """Identity and location of the run."""
    executor: Executor = Field(default_factory=LocalExecutor, json_schema_extra=SAFE)
    """Where jobs run: `local` processes or `slurm` jobs."""
    sandbox: SandboxConfig = SandboxConfig()
    """Where model-written code runs: backend, runtime, limits, network, warm pool."""
    verify: VerifyConfig = VerifyConfig()
    """Weights and gates of the verification checks that make the reward."""
    smoke: SmokeRole | None = None
    """The smoke role (plumbing check); absent: not run."""
    validation: ValidateRole | None = None
    """Task validation as a job array; absent: not run."""
    model: ModelConfig = ModelConfig()
    """The base policy: checkpoint folder or built-in model, and dtype."""
    generator: GeneratorRole | None = None
    """Generators serving the policy; absent: not run."""

    @model_validator(mode="after")
    def _check_combinations(self) -> Config:
        if not self.roles():
            raise ValueError(f"no role is configured: add a section for one of {sorted(ROLE_TYPES)}")
        for name, role in self.roles().items():
            if isinstance(self.executor, LocalExecutor) and role.job.nodes > 1:
                raise ValueError(
                    f"{name}.job.nodes = {role.job.nodes} needs executor.type = 'slurm'; "
                    "the local executor has one node"
                )
            if isinstance(self.executor, SlurmExecutor) and self.executor.signal_delay_s >= 60 * role.job.time_min:
                raise ValueError(
                    f"executor.signal_delay_s = {self.executor.signal_delay_s} is not shorter than "
                    f"{name}.job.time_min = {role.job.time_min} minutes: the job would be signalled "
                    "before it starts"
                )
        return self

    def roles(self) -> dict[str, RoleConfig]:
        """The configured roles, by name, in a fixed order."""
        out = {}
        for name in ROLE_TYPES:
            section = getattr(self, name)
            if section is not None:
                out[name] = section
        return out

    @property
    def run_dir(self) -> Path:
        return self.run.root / self.run.name


# ----------------------------------------------------------------- loading


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["a.b=1", "c=x"]` -> nested dict. Values are TOML; a bare word is a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key):
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. smoke.steps=20")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part} is given both a value and sub-keys")
        node[parts[-1]] = value
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _format_errors(err: ValidationError, source: str, raw: dict[str, Any]) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        # tagged unions put the tag into the location: executor.slurm.partition
        if len(loc) >= 2 and loc[0] == "executor" and loc[1] in ("local", "slurm"):
            del loc[1]
        key = ".".join(loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if "input" in e and e["type"] not in ("value_error", "model_type") and not isinstance(e["input"], dict):
                msg += f" (got {e['input']!r})"
        lines.append(f"{source}: {key}: {msg}" if loc else f"{source}: {msg}")
    return "\n".join(lines)


def load_config(
    path: str | os.PathLike[str],
    overrides: list[str] | None = None,
    cluster: str | None = None,
    base_dir: Path | None = None,
) -> Config:
    """Read, override and validate a run config. `cluster` ("local"|"slurm")
    replaces `executor.type`. Raises ConfigError naming the file and key."""
    path = Path(path)
    source = str(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None
    if overrides:
        raw = _merge(raw, parse_overrides(overrides))
        source += " (with --set)"
    return validate_config(raw, source, cluster=cluster, base_dir=base_dir or Path.cwd())


def validate_config(
    raw: dict[str, Any], source: str, cluster: str | None = None, base_dir: Path | None = None
) -> Config:
    raw = dict(raw)
    executor = dict(raw.get("executor") or {})
    if cluster is not None:
        if cluster not in ("local", "slurm"):
            raise ConfigError(f"--cluster {cluster!r}: expected 'local' or 'slurm'")
        if executor.get("type") != cluster:
            # switching backend: options of the other backend do not apply
            executor = {} if cluster == "local" else {k: v for k, v in executor.items() if k != "type"}
        executor["type"] = cluster
    elif "type" not in executor:
        if shutil.which("sbatch"):
            raise ConfigError(
                f"{source}: executor.type: not set, and Slurm is installed on this machine; "
                "choose explicitly with --cluster local or --cluster slurm"
            )
        executor["type"] = "local"
    raw["executor"] = executor
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source, raw)) from None
    if executor["type"] == "slurm" and not shutil.which("sbatch"):
        raise ConfigError(f"{source}: executor.type = 'slurm' but sbatch is not on PATH")
    if not cfg.run.root.is_absolute():
        cfg.run.root = ((base_dir or Path.cwd()) / cfg.run.root).resolve()
    if cfg.validation is not None:
        tasks_file = cfg.validation.tasks_file
        if not tasks_file.is_absolute():
            cfg.validation.tasks_file = tasks_file = ((base_dir or Path.cwd()) / tasks_file).resolve()
        if not tasks_file.is_file():
            raise ConfigError(f"{source}: validation.tasks_file: {tasks_file} does not exist")
    return cfg


# ----------------------------------------------------------------- TOML out


def to_plain(cfg: Config) -> dict[str, Any]:
    """The resolved config as plain TOML-able data (no None values)."""

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if v is not None}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(cfg.model_dump(mode="json"))


def dump_toml(cfg: Config) -> str:
    import tomli_w

    return tomli_w.dumps(to_plain(cfg))


# ------------------------------------------------------------ mid-run changes


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain configs."""
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        path = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            keys += config_diff(a, b, path + ".")
        elif a != b:
            keys.append(path)
    return keys


def _is_safe(key: str) -> bool:
    model: Any = Config
    for part in key.split("."):
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return False
        field = fields[part]
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("mid_run_safe"):
            return True
        ann = field.annotation
        args = [a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else (args[0] if args else None)
        if model is None:
            return False
    return False


def unsafe_changes(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """Split the differences between two configs into (safe, unsafe) keys."""
    changed = config_diff(to_plain(old), to_plain(new))
    return [k for k in changed if _is_safe(k)], [k for k in changed if not _is_safe(k)]


def describe_fields(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, bool]]:
    """(dotted key, doc, mid_run_safe) for every field, for `sarl config show --doc`."""
    rows = []
    for name, field in model.model_fields.items():
        key = prefix + name
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        rows.append((key, (field.description or "").replace("\n", " "), bool(extra.get("mid_run_safe"))))
        ann = field.annotation
        subs = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        for sub in subs:
            rows += [r for r in describe_fields(sub, key + ".") if r not in rows]
    return rows
