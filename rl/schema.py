"""What every config section shares (pydantic only): the base model, the
`mid_run_safe` mark, and the one way to write a tagged union.

A tagged union chooses a backend by its `type` key, everywhere in the
config (`[executor]`, `[sandbox.backend]`, `[generator.engine]`, ...). A
section written without `type` takes the union's default backend
(`default_tag`); an unknown `type` is an error that names the key and lists
the values it can take.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic.json_schema import JsonDict

TAG = "type"
"""The key that chooses the member of every tagged union."""

SAFE: JsonDict = {"mid_run_safe": True}
"""`json_schema_extra` of a field that may change in a live run (see rl.config)."""


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, defaults are
    validated, and each field's docstring is its documentation."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


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


__all__ = ["SAFE", "TAG", "Section", "default_tag", "models_in", "tag_of", "tag_values"]
