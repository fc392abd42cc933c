"""Executable tasks: the JSONL format and its loader (importers: rl.tasks.importers).

One task per line (documented field by field below; `sarl tasks schema`
prints the JSON schema). A policy sees `prompt` and `files`; it never sees
`tests` or `reference`. Verification writes `files`, then the policy's
solution, then runs `tests` (pristine, from the task, not from the sandbox).

Test formats:
  humaneval  `tests` holds code defining `check(candidate)`, whose statements
             are the test cases (each `assert` one case); the solution is
             `prompt + completion`, the candidate its `entry_point`.
  workspace  the same `check(m)`, where `m` is the module `entry_point`
             (e.g. `textkit.slug`) imported from the episode's final work
             dir: `m.slugify("A b")` calls its function. Files under
             `tests/` are the task's own, put back before grading. The
             reference is the files the fix changes, as a JSON object
             {path: new content} (a whole-file patch).
  sql        `tests` is {"reference": SQL, "ordered": bool}; `files` holds
             `data.sql`, the script that builds the SQLite database. An
             answer is a query, right when its rows equal the reference
             query's (as a multiset unless `ordered`). The reference is the
             reference query.
  node       `tests` is {"calls": [[args...], ...], "expected": [...],
             "visible": N}: the function `entry_point` of the solution (a
             whole JavaScript function) is called with each argument list by
             Node.js; its JSON answer must equal the expected value (2 and
             2.0 alike, true and 1 not). The first N calls are the visible
             examples. `runtime` is `node`.
  harbor     a Harbor task (rl.tasks.harbor): `tests` is {path: content} of
             its tests/ folder; `tests/test.sh` runs in the final work dir and
             writes the reward file; the reference is the oracle, solve.sh.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl.errors import SarlError


class TaskError(SarlError, ValueError):
    """A task file or line that cannot be used; the message names the line and field."""

    exit_code = 2


class TaskLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    wall_s: float = Field(10.0, gt=0)
    """Wall-clock seconds for the whole test run."""
    call_s: float = Field(3.0, gt=0)
    """Seconds one call of the candidate may take."""
    memory_mb: int = Field(512, ge=16)
    """Memory of the sandbox while the tests run."""


class Example(BaseModel):
    """A visible check: a call and the repr it should give. The policy sees
    these (they are in the prompt) and the agent runs them during an episode;
    the hidden `tests` decide the reward."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    call: str = Field(min_length=1)
    """A Python expression, e.g. `add(2, 3)`."""
    expected: str
    """What the expression should evaluate to, as Python source, e.g. `5`."""


class Task(BaseModel):
    """One executable task."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    task_id: str = Field(min_length=1)
    """Unique id, e.g. `HumanEval/0`."""
    prompt: str
    """What the policy sees; for HumanEval, the function signature and docstring."""
    entry_point: str = Field(min_length=1)
    """Name of the function the tests call."""
    tests: str = Field(min_length=1)
    """Test code (never shown to the policy); format given by `test_format`."""
    test_format: Literal["humaneval", "workspace", "sql", "node", "harbor", "text"] = "humaneval"
    """How `tests` is run (see the module docstring)."""
    environment: str = Field("function", pattern=r"^(function|workspace|sql|node|text|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$")
    """The environment that plays the task: `function` (write one function),
    `workspace` (files and tools), `sql` (questions over a database), `node`
    (a JavaScript function), `text` (rewrite a text in the reply), or a
    `module:Class` (docs/environments.md)."""
    reference: str = ""
    """A reference completion that passes every test (validation uses it)."""
    files: dict[str, str] = Field(default_factory=dict)
    """Starting files of the work dir, by relative path."""
    examples: list[Example] = Field(default_factory=list)
    """Visible checks, from the prompt (HumanEval: its `>>>` lines); never the hidden tests."""
    expected_files: dict[str, str] = Field(default_factory=dict)
    """Files the episode must leave behind, by relative path (the final-state check)."""
    runtime: Literal["system", "venv", "node"] = "system"
    """Sandbox runtime the task needs."""
    limits: TaskLimits = TaskLimits()
    """Limits of one verification."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form: source, difficulty, tags."""


def _format(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(line)"
        msg = (
            "unknown field"
            if err["type"] == "extra_forbidden"
            else ("required field is missing" if err["type"] == "missing" else err["msg"])
        )
        parts.append(f"{key}: {msg}")
    return "; ".join(parts)


_SHOWN_ERRORS = 20


class LineErrors:
    """Every bad line of a file, raised together at its end: one pass of
    `sarl tasks validate` names them all, not one per try."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []
        self._task_ids: dict[str, int] = {}

    def objects(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, object) of each non-empty line of the JSONL (or .gz)
        file that is a JSON object; a line that does not parse, or is not an
        object, is recorded as bad."""
        opener = gzip.open if self.path.suffix == ".gz" else open
        try:
            f = opener(self.path, "rt")
        except FileNotFoundError:
            raise TaskError(f"{self.path}: no such file") from None
        with f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as e:
                    self.add(n, f"not valid JSON: {e.msg}")
                    continue
                if isinstance(data, dict):
                    yield n, data
                else:
                    self.add(n, f"expected a JSON object, got {type(data).__name__}")

    def new_task_id(self, n: int, task_id: str) -> bool:
        """Whether line n is the first with this task id; a repeat is recorded as bad."""
        first = self._task_ids.setdefault(task_id, n)
        if first != n:
            self.add(n, f"task_id {task_id!r} already used on line {first}")
        return first == n

    def add(self, n: int, problem: str) -> None:
        self.lines.append(f"{self.path}:{n}: {problem}")

    def raise_any(self) -> None:
        if not self.lines:
            return
        more = len(self.lines) - _SHOWN_ERRORS
        tail = [f"... and {more} more bad lines"] if more > 0 else []
        raise TaskError("\n".join(self.lines[:_SHOWN_ERRORS] + tail))


def read_tasks(path: str | os.PathLike[str]) -> Iterator[Task]:
    """Tasks of a JSONL file (optionally .gz). Raises TaskError naming every
    bad line (the first 20), after the good ones before it were yielded."""
    path = Path(path)
    errors = LineErrors(path)
    for n, data in errors.objects():
        try:
            task = Task.model_validate(data)
        except ValidationError as e:
            errors.add(n, _format(e))
            continue
        if not errors.new_task_id(n, task.task_id):
            continue
        if not errors.lines:  # after a bad line, only its fellows are looked for
            yield task
    errors.raise_any()


def write_tasks(path: str | os.PathLike[str], tasks: list[Task]) -> None:
    from rl.fsio import atomic_write

    atomic_write(Path(path), "".join(t.model_dump_json() + "\n" for t in tasks))


def read_samples(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """HumanEval-style samples: JSONL lines with `task_id` and `completion`."""
    path = Path(path)
    errors = LineErrors(path)
    for n, data in errors.objects():
        missing = [k for k in ("task_id", "completion") if not isinstance(data.get(k), str)]
        if missing:
            errors.add(n, "; ".join(f"{k}: required string field is missing" for k in missing))
        elif not errors.lines:
            yield n, data
    errors.raise_any()
