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

import json
import os
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from rl.agent.config import AgentConfig
from rl.engine.config import EngineConfig, VLLMEngineConfig
from rl.errors import ConfigError
from rl.eval.config import EvalRole
from rl.generator.config import GeneratorRole
from rl.learner.config import LearnerRole
from rl.model import ModelConfig
from rl.rollout.config import RolloutRole
from rl.run.config import Executor, LocalExecutor, RunSection, SlurmExecutor
from rl.schema import SAFE, TAG, JobResources, RoleConfig, Section, models_in, resolved_from, tag_values
from rl.smoke.config import SmokeRole
from rl.validation.config import ValidationRole
from rl.verify.config import VerifyConfig
from sandboxes.config import SandboxConfig

__all__ = [
    "ROLES",
    "Config",
    "ConfigError",
    "JobResources",
    "LocalExecutor",
    "RoleConfig",
    "RoleSpec",
    "SlurmExecutor",
    "GeneratorRole",
    "EvalRole",
    "LearnerRole",
    "RolloutRole",
    "SmokeRole",
    "ValidationRole",
    "config_diff",
    "dump_toml",
    "load_config",
    "parse_overrides",
    "unsafe_changes",
]


# ---------------------------------------------------------------------- roles


def role(job_class: str) -> Any:
    """A role section of `Config`: absent (None) unless configured. This one
    line registers the role: its config type is the field's annotation, and
    `job_class` ("module:Class", a subclass of rl.run.role.Role) is what
    its jobs run. Keep the module path stable: submitted pickles name it."""
    return Field(None, json_schema_extra={"role": job_class})


@dataclass(frozen=True)
class RoleSpec:
    """A registered role: its config section and the class its jobs run."""

    name: str
    config: type[RoleConfig]
    job_class: str


# ---------------------------------------------------------------------- run


class Config(Section):
    """A whole run: its identity, where jobs run, and its roles."""

    run: RunSection
    """Identity and location of the run."""
    executor: Executor = Field(default_factory=LocalExecutor, json_schema_extra=SAFE)
    """Where jobs run: `local` processes or `slurm` jobs."""
    sandbox: SandboxConfig = SandboxConfig()
    """Where model-written code runs: backend, runtime, limits, network, warm pool."""
    verify: VerifyConfig = VerifyConfig()
    """Weights and gates of the verification checks that make the reward."""
    model: ModelConfig = ModelConfig()
    """The base policy: checkpoint folder or built-in model, and dtype."""

    # Roles: one field each, in the order they are submitted.
    smoke: SmokeRole | None = role("jobs.smoke:SmokeJob")
    """The smoke role (plumbing check); absent: not run."""
    validation: ValidationRole | None = role("jobs.validation:ValidationJob")
    """Task validation as a job array; absent: not run."""
    generator: GeneratorRole | None = role("jobs.generator:GeneratorJob")
    """Generators serving the policy; absent: not run."""
    rollout: RolloutRole | None = role("jobs.rollout:RolloutJob")
    """Rollout workers playing episodes against the generators; absent: not run."""
    learner: LearnerRole | None = role("jobs.learner:LearnerJob")
    """The learner training on committed rollouts; absent: not run."""
    eval: EvalRole | None = role("jobs.eval:EvalJob")
    """Evaluation of published versions on held-out tasks; absent: not run."""

    def agent(self) -> AgentConfig:
        """The run's agent: the rollouts', else the default (what evaluation
        and SFT on references play when they have none of their own)."""
        return self.rollout.agent if self.rollout is not None else AgentConfig()

    def engine(self) -> EngineConfig:
        """The run's inference engine: the generators', else vLLM's default."""
        return self.generator.engine if self.generator is not None else VLLMEngineConfig()

    @model_validator(mode="after")
    def _check_combinations(self) -> Config:
        for name, role in self.roles().items():
            if isinstance(self.executor, LocalExecutor) and role.job.nodes > 1:
                raise ValueError(
                    f"{name}.job.nodes = {role.job.nodes} needs executor.type = 'slurm'; "
                    "the local executor has one node"
                )
            if role.job.cpu_list is not None:
                _check_cpu_list(name, role.job.cpu_list, self.executor)
            if name != "learner" and (role.job.nodes > 1 or role.job.tasks_per_node > 1):
                raise ValueError(
                    f"{name}.job: nodes = {role.job.nodes}, tasks_per_node = {role.job.tasks_per_node}: only the "
                    "learner runs several processes per task; scale other roles with `workers`"
                )
            if name == "rollout" and self.generator is None:
                raise ValueError("rollout: rollout workers need generators: add a [generator] section")
            if isinstance(self.executor, SlurmExecutor) and self.executor.signal_delay_s >= 60 * role.job.time_min:
                raise ValueError(
                    f"executor.signal_delay_s = {self.executor.signal_delay_s} is not shorter than "
                    f"{name}.job.time_min = {role.job.time_min} minutes: the job would be signalled "
                    "before it starts"
                )
        self._check_staleness()
        if self.learner is not None:
            self._check_learner(self.learner)
        self._resolve()
        return self

    def _resolve(self) -> None:
        """Copy what a role needs from another into its own section: the one
        place where sections meet, so that each role reads its own alone. A
        `resolved` field that the user set is refused, naming its source."""
        for name, section in self.roles().items():
            for key, field in type(section).model_fields.items():
                source = resolved_from(field)
                if source is not None and key in section.model_fields_set:
                    raise ValueError(f"{name}.{key}: not set in a run config; it is {source}'s (resolved)")
        if self.rollout is not None:
            self.rollout.max_model_len = self.engine().max_model_len
            self.rollout.model_fields_set.discard("max_model_len")
        if self.learner is not None:
            self.learner.agent = self.agent()
            self.learner.groups_per_step = self.rollout.groups_per_step or None if self.rollout else None
            self.learner.eval_every = self.eval.every if self.eval is not None else None
            self.learner.model_fields_set.discard("agent")
            self.learner.model_fields_set.discard("groups_per_step")
            self.learner.model_fields_set.discard("eval_every")
        if self.eval is not None:
            self.eval.agent = self.eval.agent or self.agent()
            self.eval.engine = self.eval.engine or self.engine()

    def _check_learner(self, lc: LearnerRole) -> None:
        ranks = lc.job.nodes * lc.job.tasks_per_node
        if lc.micro_batches is not None and lc.micro_batches % ranks:
            raise ValueError(
                f"learner.micro_batches = {lc.micro_batches} is not a multiple of the {ranks} ranks "
                "(job.nodes x job.tasks_per_node): each rank takes the same number of micro-batches"
            )
        if lc.train_top_layers is not None:
            blocks = _decoder_blocks(self.model.path)
            if blocks is not None and lc.train_top_layers > blocks:
                raise ValueError(
                    f"learner.train_top_layers = {lc.train_top_layers}: {self.model.path} has {blocks} decoder blocks"
                )
        if self.run.mode == "sync" and lc.publish_every != 1:
            raise ValueError(
                f"learner.publish_every = {lc.publish_every}: run.mode = 'sync' trains step N + 1 "
                "on samples of version N, so every step must be published"
            )

    def _check_staleness(self) -> None:
        """The staleness bound, the run's mode and the step sizes the roles
        use must agree; each error names the keys that disagree."""
        run, r, lc = self.run, self.rollout, self.learner
        if run.mode == "sync":
            if run.max_staleness not in (None, 0):
                raise ValueError(
                    f"run.max_staleness = {run.max_staleness}: run.mode = 'sync' generates every sample "
                    "with the current version (staleness 0); remove it, or set run.mode = 'async'"
                )
            if r is not None and r.groups_per_step == 0:
                raise ValueError(
                    "rollout.groups_per_step: run.mode = 'sync' plays one round of groups per learner step; "
                    "set how many groups a step takes"
                )
            if r is not None and lc is not None and not _from_references(lc):
                if lc.tokens_per_step is not None:
                    raise ValueError(
                        f"learner.tokens_per_step = {lc.tokens_per_step}: run.mode = 'sync' trains each step on "
                        "one round of rollout.groups_per_step groups; remove it"
                    )
                if lc.samples_per_step != r.groups_per_step * r.group_size:
                    raise ValueError(
                        f"learner.samples_per_step = {lc.samples_per_step} must equal rollout.groups_per_step x "
                        f"rollout.group_size = {r.groups_per_step} x {r.group_size} = "
                        f"{r.groups_per_step * r.group_size}: in run.mode = 'sync' a step trains on exactly "
                        "one round, and any other size waits for a round that never fills"
                    )
        elif run.max_staleness is not None and r is not None and r.groups_per_step == 0:
            raise ValueError(
                "run.max_staleness needs rollout.groups_per_step: the rollout workers' bound counts "
                "learner steps, and without it no step size is known"
            )

    def roles(self) -> dict[str, RoleConfig]:
        """The configured roles, by name, in a fixed order."""
        out = {}
        for name in ROLES:
            section = getattr(self, name)
            if section is not None:
                out[name] = section
        return out

    def require_roles(self, source: str) -> None:
        """Commands that submit jobs need a role; others (verify, eval) do not."""
        if not self.roles():
            raise ConfigError(f"{source}: no role is configured: add a section for one of {sorted(ROLES)}")

    @property
    def run_dir(self) -> Path:
        return self.run.root / self.run.name


def _registered_roles() -> dict[str, RoleSpec]:
    out = {}
    for name, field in Config.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "role" in extra:
            config = next(a for a in getattr(field.annotation, "__args__", ()) if a is not type(None))
            out[name] = RoleSpec(name, config, str(extra["role"]))
    return out


ROLES: dict[str, RoleSpec] = _registered_roles()
"""Every role, by section name, in submission order: derived from `Config`."""

_TAGS = tag_values(Config)

MOVED = {
    "rollout.max_staleness": "run.max_staleness",
    "learner.max_staleness": "run.max_staleness",
}
"""Keys that a run config of an earlier sarl may still hold, and where they went."""


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


def _user_location(loc: tuple[Any, ...], raw: Any) -> list[str]:
    """The dotted key as the user wrote it: pydantic adds the chosen member's
    tag of a tagged union to the location (`generator.engine.vllm.max_model_len`);
    it is dropped wherever the user's input has no such key."""
    out: list[str] = []
    node = raw
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            node = node[part]  # type: ignore[index]
        elif part in _TAGS and isinstance(node, dict | BaseModel):
            continue  # the tag pydantic inserted (the input may also be a default model)
        else:
            node = None
        out.append(str(part))
    return out


def _format_errors(err: ValidationError, source: str, raw: dict[str, Any]) -> str:
    lines = []
    for e in err.errors():
        loc = _user_location(e["loc"], raw)
        if e["type"] == "extra_forbidden":
            moved = MOVED.get(".".join(loc))
            msg = f"moved to {moved}" if moved else "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] == "union_tag_invalid":
            loc.append(TAG)
            msg = f"expected one of {e['ctx']['expected_tags']} (got {e['ctx']['tag']!r})"
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if "input" in e and e["type"] not in ("value_error", "model_type") and not isinstance(e["input"], dict):
                msg += f" (got {e['input']!r})"
        key = ".".join(loc)
        lines.append(f"{source}: {key}: {msg}" if loc else f"{source}: {msg}")
    return "\n".join(lines)


def _check_cpu_list(name: str, cpus: list[int], executor: Any) -> None:
    """A pinned role's cores must exist on this machine (the local executor
    runs every role here); on Slurm the scheduler places tasks."""
    if not isinstance(executor, LocalExecutor):
        raise ValueError(
            f"{name}.job.cpu_list: pinning to cores is for executor.type = 'local'; "
            "on Slurm ask for cores with cpus_per_task"
        )
    have = os.cpu_count() or 1
    bad = [c for c in cpus if not 0 <= c < have]
    if bad or len(set(cpus)) != len(cpus):
        why = f"cores {bad} do not exist (this machine has 0-{have - 1})" if bad else "a core is listed twice"
        raise ValueError(f"{name}.job.cpu_list = {cpus}: {why}")


def _decoder_blocks(model_path: str) -> int | None:
    """The number of decoder blocks of a model, from its config.json
    (SmolLM2-135M, the built-in model: 30); None when it does not say."""
    if model_path == "smollm2-135m-instruct":
        return 30
    try:
        n = json.loads((Path(model_path) / "config.json").read_text()).get("num_hidden_layers")
    except (OSError, ValueError):
        return None
    return n if isinstance(n, int) else None


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
    base = base_dir or Path.cwd()
    if cfg.validation is not None:
        cfg.validation.tasks_file = _resolve_file(cfg.validation.tasks_file, base, f"{source}: validation.tasks_file")
    if cfg.rollout is not None:
        files = cfg.rollout.tasks_file
        for i, f in enumerate(files):
            where = f"{source}: rollout.tasks_file" + (f"[{i}]" if len(files) > 1 else "")
            files[i] = _resolve_file(f, base, where)
        _check_tasks(files, f"{source}: rollout.tasks_file")
        harness = cfg.rollout.agent.harness
        if harness is not None:
            for name, f in harness.files.items():
                harness.files[name] = _resolve_file(f, base, f"{source}: rollout.agent.harness.files.{name}")
            if cfg.run.mode == "sync":
                raise ConfigError(
                    f"{source}: rollout.agent.harness: a harness program's calls are not held to one round's "
                    "version; use run.mode = 'async'"
                )
    if cfg.learner is not None and cfg.learner.loss.type == "sft":
        _check_sft_files(cfg.learner.loss, base, source)
    if cfg.eval is not None:
        cfg.eval.tasks_file = _resolve_file(cfg.eval.tasks_file, base, f"{source}: eval.tasks_file")
        _check_tasks([cfg.eval.tasks_file], f"{source}: eval.tasks_file")
        _check_held_out(cfg, source)
    return cfg


def _check_sft_files(loss: Any, base: Path, source: str) -> None:
    """SFT's task file (references to train on) or traces file, resolved
    against the config's folder and read before anything is submitted."""
    if loss.tasks_file is not None:
        loss.tasks_file = _resolve_file(loss.tasks_file, base, f"{source}: learner.loss.tasks_file")
        _check_tasks([loss.tasks_file], f"{source}: learner.loss.tasks_file")
        from rl.tasks.format import read_tasks

        if not any(t.reference.strip() for t in read_tasks(loss.tasks_file)):
            raise ConfigError(f"{source}: learner.loss.tasks_file: {loss.tasks_file} has no task with a reference")
    if loss.traces_file is not None:
        from rl.tasks.traces import read_traces

        loss.traces_file = _resolve_file(loss.traces_file, base, f"{source}: learner.loss.traces_file")
        try:
            read_traces(loss.traces_file)
        except ValueError as e:
            raise ConfigError(f"{source}: learner.loss.traces_file: {e}") from None


def _from_references(lc: LearnerRole) -> bool:
    """SFT on reference solutions or tool traces: the learner reads no rollouts."""
    return lc.loss.type == "sft" and lc.loss.source in ("references", "traces")


def _resolve_file(path: Path, base: Path, where: str) -> Path:
    path = path if path.is_absolute() else (base / path).resolve()
    if not path.is_file():
        raise ConfigError(f"{where}: {path} does not exist")
    return path


def _check_held_out(cfg: Config, source: str) -> None:
    """A held-out task that the run trains on is not held out: the same id
    or the same prompt in a training file is refused."""
    from rl.tasks.format import read_tasks

    assert cfg.eval is not None
    train = list(cfg.rollout.tasks_file) if cfg.rollout is not None else []
    loss = cfg.learner.loss if cfg.learner is not None else None
    if loss is not None and loss.type == "sft" and loss.tasks_file is not None:
        train.append(loss.tasks_file)
    held = {t.task_id: t.prompt.strip() for t in read_tasks(cfg.eval.tasks_file)}
    prompts = set(held.values())
    for path in train:
        for t in read_tasks(path):
            if t.task_id in held or t.prompt.strip() in prompts:
                raise ConfigError(
                    f"{source}: eval.tasks_file: task {t.task_id!r} of {path} is also in the held-out file "
                    f"{cfg.eval.tasks_file}: a held-out set must not overlap the training tasks "
                    "(`sarl tasks split` makes disjoint ones)"
                )


def _check_tasks(paths: list[Path], where: str) -> None:
    """The task files a role draws from must be sound before anything is
    submitted: every line a task, none empty, no task id in two files."""
    from rl.errors import SarlError
    from rl.tasks.format import read_tasks

    seen: dict[str, Path] = {}
    for path in paths:
        try:
            ids = [t.task_id for t in read_tasks(path)]
        except SarlError as e:
            raise ConfigError(f"{where}: {e}") from None
        if not ids:
            raise ConfigError(f"{where}: {path} holds no task")
        for tid in ids:
            if tid in seen and seen[tid] != path:
                raise ConfigError(f"{where}: task id {tid!r} is in both {seen[tid]} and {path}")
            seen[tid] = path


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
    """A key is safe when it, or a section above it, is marked `mid_run_safe`
    (in any member of a tagged union on the way)."""
    models: list[type[BaseModel]] = [Config]
    for part in key.split("."):
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        if not fields:
            return False
        if any(isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("mid_run_safe") for f in fields):
            return True
        models = [m for f in fields for m in models_in(f.annotation)]
    return False


def unsafe_changes(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """Split the differences between two configs into (safe, unsafe) keys."""
    changed = config_diff(to_plain(old), to_plain(new))
    return [k for k in changed if _is_safe(k)], [k for k in changed if not _is_safe(k)]
