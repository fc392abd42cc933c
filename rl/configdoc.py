"""The documentation of every config key, from the schema's field
docstrings: `sarl config show --doc` (one line per key) and
`sarl config reference` (docs/configuration.md, whose staleness a test
catches)."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rl.config import Config
from rl.schema import TAG, models_in, resolved_from


def describe_fields(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, bool]]:
    """(dotted key, doc, mid_run_safe) for every field, for `sarl config show --doc`."""
    rows = []
    for name, field in model.model_fields.items():
        key = prefix + name
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        rows.append((key, (field.description or "").replace("\n", " "), bool(extra.get("mid_run_safe"))))
        for sub in models_in(field.annotation):
            rows += [r for r in describe_fields(sub, key + ".") if r not in rows]
    return rows


HEADER = """# Configuration reference

Every key of a run config (`run.toml`), generated from the schema's field
docstrings by `sarl config reference` (a test fails when this page differs
from what the schema says). `sarl config show RUN.toml` prints a config
with every default filled in; `sarl config schema` prints its JSON schema.

A key marked *safe mid-run* may change in a live run (`sarl resume --set`,
or a later `sarl submit`): it changes how jobs are scheduled, not what the
run computes. Any other change to a frozen run is refused. A key marked
*resolved* is not written in a run config: it is copied from another
section when the config is validated, so that each role reads its own
section alone (docs/layout.md). A section with several backends chooses
one with `type`; without it, the first listed is taken.
"""


def reference() -> str:
    """docs/configuration.md: every section, its backends and its keys."""
    out = [HEADER]
    for name, field in Config.model_fields.items():
        _section(out, name, field, level=2)
    return "\n".join(out).rstrip() + "\n"


def _section(out: list[str], key: str, field: Any, level: int) -> None:
    members = models_in(field.annotation)
    for model in members:
        tag = _tag(model) if len(members) > 1 else None
        title = f"`[{key}]`" + (f' with `type = "{tag}"`' if tag else "")
        out += [f"{'#' * level} {title}", ""]
        out += [_doc(model.__doc__ or "") or _doc(field.description or ""), ""]
        subsections = []
        for name, sub in model.model_fields.items():
            if models_in(sub.annotation):
                subsections.append((f"{key}.{name}", sub))
            else:
                out.append(_key_line(f"{key}.{name}", sub))
        out.append("")
        for sub_key, sub in subsections:
            _section(out, sub_key, sub, min(level + 1, 4))


def _key_line(key: str, field: Any) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    facts = [f"`{_type(field.annotation)}`"]
    source = resolved_from(field)
    if source is not None:
        facts.append(f"resolved from `{source}`")
    elif field.is_required():
        facts.append("required")
    else:
        facts.append(f"default `{_default(field)}`")
    if extra.get("mid_run_safe"):
        facts.append("*safe mid-run*")
    return f"- **`{key}`** ({', '.join(facts)}): {_doc(field.description or '')}"


def _doc(text: str) -> str:
    return " ".join(text.split())


def _tag(model: type[BaseModel]) -> str:
    return str(model.model_fields[TAG].default)


def _default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "none"
    if isinstance(value, BaseModel):
        return "{}"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value).replace("'", '"')
    return str(value)


def _type(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(repr(a).replace("'", '"') for a in get_args(annotation))
    if origin is not None and str(origin) in ("typing.Union", "<class 'types.UnionType'>"):
        return " | ".join(_type(a) for a in get_args(annotation))
    if origin is not None and getattr(origin, "__name__", "") == "Annotated":
        return _type(get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(_type(a) for a in get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "none"
    return getattr(annotation, "__name__", str(annotation))
