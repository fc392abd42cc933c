"""What every config section shares (pydantic only): the base model, the
`mid_run_safe` mark, the one way to write a tagged union, the fields every
role shares (`RoleConfig`, `JobResources`), and the mark of a value that
rl.config resolves from another section (`resolved`).

A tagged union chooses a backend by its `type` key, everywhere in the
config (`[executor]`, `[sandbox.backend]`, `[generator.engine]`, ...). A
section written without `type` takes the union's default backend
(`default_tag`); an unknown `type` is an error that names the key and lists
the values it can take.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.json_schema import JsonDict

TAG = "type"
"""The key that chooses the member of every tagged union."""

SAFE: JsonDict = {"mid_run_safe": True}
"""`json_schema_extra` of a field that may change in a live run (see rl.config)."""


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, defaults are
    validated, and each field's docstring is its documentation."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


def resolved(source: str) -> Any:
    """A field of a role's section that the user does not write: rl.config
    copies it from `source` (a dotted key of another section) when the
    config is validated, once, in one place, so that a role reads its own
    section alone. It is not written to run.toml (it follows from what is)."""
    return Field(None, exclude=True, json_schema_extra={"resolved_from": source})


def resolved_from(field: Any) -> str | None:
    """The source of a `resolved` field, or None for a field the user writes."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    source = extra.get("resolved_from")
    return str(source) if source is not None else None


def tag_of(model: type[BaseModel]) -> str:
    """The tag value of a union member: the default of its `type: Literal[...]` field."""
    field = model.model_fields.get(TAG)
    if field is None or not isinstance(field.default, str) or get_args(field.annotation) != (field.default,):
        raise TypeError(f"{model.__name__} needs a field `{TAG}: Literal['name'] = 'name'` to be a union member")
    return field.default


def default_tag(member: type[BaseModel]) -> BeforeValidator:
    """The metadata that makes a tagged union take `member` when its section
    has no `type`. A tagged union is written, in every config section, as

        Backend = Annotated[Bwrap | Apptainer, Field(discriminator=TAG), default_tag(Bwrap)]
    """
    tag = tag_of(member)

    def fill(value: Any) -> Any:
        if isinstance(value, dict) and TAG not in value:
            return {TAG: tag, **value}
        return value

    return BeforeValidator(fill)


def tag_values(model: type[BaseModel]) -> set[str]:
    """Every tag of every tagged union reachable from `model`. pydantic puts
    the chosen tag into an error's location (`generator.engine.vllm.max_model_len`);
    the config loader drops it again, so that errors name the key the user wrote."""
    out: set[str] = set()
    seen: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        field = m.model_fields.get(TAG)
        if field is not None and isinstance(field.default, str):
            out.add(field.default)
        todo += [sub for f in m.model_fields.values() for sub in models_in(f.annotation)]
    return out


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The section types an annotation can hold: through `X | None`, tagged
    unions and `Annotated`."""
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    if get_origin(annotation) is Annotated:
        return models_in(get_args(annotation)[0])
    return [m for arg in get_args(annotation) for m in models_in(arg)]


# ------------------------------------------------------------ every role


class JobResources(Section):
    """What one task of a role asks the scheduler for."""

    partition: str | None = Field(None, json_schema_extra=SAFE)
    """Partition for this role; defaults to `executor.partition`."""
    time_min: int = Field(60, ge=1, json_schema_extra=SAFE)
    """Time limit of one job, in minutes. A role that reaches it checkpoints and
    requeues itself."""
    nodes: int = Field(1, ge=1, json_schema_extra=SAFE)
    """Nodes per task (multi-node only for the learner)."""
    tasks_per_node: int = Field(1, ge=1, le=1024, json_schema_extra=SAFE)
    """Processes per node of one task (`--ntasks-per-node`): the learner's
    torch.distributed ranks are `nodes` x `tasks_per_node`. Other roles: 1."""
    cpus_per_task: int = Field(1, ge=1, json_schema_extra=SAFE)
    """CPU cores per task."""
    cpu_list: list[int] | None = Field(None, min_length=1, json_schema_extra=SAFE)
    """Local executor only: pin this role's processes (and all they start:
    engines, sandboxes) to these cores, and size their compute threads to
    them (OMP_NUM_THREADS, vLLM's thread binding). None: the role shares
    every core (right for sync runs, whose roles take turns). On Slurm the
    scheduler places tasks (`cpus_per_task`)."""
    gpus_per_task: int = Field(0, ge=0, json_schema_extra=SAFE)
    """GPUs per task (`--gpus-per-node` on Slurm)."""
    mem_gb: float = Field(2.0, gt=0, json_schema_extra=SAFE)
    """Memory per task, in GiB."""
    array_parallelism: int | None = Field(None, ge=1, json_schema_extra=SAFE)
    """At most this many tasks of the array run at once (`--array=...%N`);
    none: no limit. The local executor enforces it with slot locks."""


class RoleConfig(Section):
    """Fields shared by every role."""

    workers: int = Field(1, ge=1, le=100_000)
    """Number of tasks in the role's job array: its workers."""
    job: JobResources = JobResources()
    """Scheduler resources of each task."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        # `tasks` named the array's size until it was renamed, so that the word
        # means only the problems (tasks_file, `sarl tasks`). A run.toml of an
        # older run is refused the same way: edit the key and resume.
        if isinstance(data, dict) and "tasks" in data:
            raise ValueError("`tasks` (the size of the role's job array) is now `workers`: rename the key")
        return data


__all__ = [
    "SAFE",
    "TAG",
    "JobResources",
    "RoleConfig",
    "Section",
    "default_tag",
    "models_in",
    "resolved",
    "resolved_from",
    "tag_of",
    "tag_values",
]
