"""What a task family gives, and how it becomes a task.

A family's `make(rng, level)` returns a `Spec`: a function's name,
signature, docstring, the reference body, and the inputs to test it on.
`build()` runs the reference on the inputs (in this process: it is our own
code) to get the expected outputs, writes the first two as the prompt's
visible examples and all of them as hidden HumanEval-style asserts, and
keeps a wrong first attempt with what it showed, where a small mutation of
the reference fails a visible example (rl.tasks.repairs).
"""

from __future__ import annotations

import copy
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl.tasks.format import Example, Task
from rl.tasks.repairs import make_repair


@dataclass
class Spec:
    name: str
    """The entry point."""
    params: str
    """The signature's parameters, with annotations: `xs: list[int], k: int`."""
    returns: str
    """The return annotation."""
    doc: str
    """What the function does, precisely enough to be solved from it."""
    body: str
    """The reference body, unindented (build() indents it)."""
    inputs: list[tuple[Any, ...]]
    """Argument tuples: the first two are the visible examples."""
    behaviour: str = ""
    """A key of what the program does on fixed probe inputs, where the family
    computes one: two tasks with one key are the same program (deduplicated)."""
    recipe: dict[str, Any] | None = None
    """What the family needs to draw more instances of this spec's template
    (other constants and inputs): kept in the task's metadata."""


@dataclass(frozen=True)
class Family:
    name: str
    what: str
    """One line: the skill the family exercises."""
    make: Callable[[Any, int], Spec]
    """(random.Random, level 1-3) -> Spec."""
    remake: Callable[[Any, int, dict[str, Any]], Spec] | None = None
    """(random.Random, level, a spec's recipe) -> a spec of the same template
    with other constants and inputs; None: draw with `make` until the
    template is the same (families of few templates)."""


LEVELS = (1, 2, 3)


class SpecError(ValueError):
    """A spec whose reference cannot be a task (it raises, or all outputs agree)."""


def _call(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def build(spec: Spec, task_id: str, metadata: dict[str, Any], repair: bool = True) -> Task:
    """The task of `spec`; with `repair`, its repair trace's wrong first
    attempt (the dearest part: drawing candidates builds without it, and again
    with it once one is kept, to the same task, as it is seeded by `task_id`)."""
    header = f"def {spec.name}({spec.params}) -> {spec.returns}:\n"
    body = textwrap.indent(spec.body.strip("\n") + "\n", "    ")
    namespace: dict[str, Any] = {}
    exec(header + body, namespace)  # the family's own reference, not a policy's code
    fn = namespace[spec.name]
    unique = list({repr(a): a for a in spec.inputs}.values())  # in order, each input once
    if len(unique) < 4:
        raise SpecError(f"{task_id}: fewer than 4 distinct test inputs")
    cases = []
    for args in unique:
        try:
            cases.append((args, fn(*copy.deepcopy(args))))
        except Exception as e:
            raise SpecError(f"{task_id}: the reference raises on {_call(spec.name, args)}: {e!r}") from None
    if len({repr(out) for _, out in cases}) < 2:
        raise SpecError(f"{task_id}: every test input gives the same output")
    shown = cases[:2]
    wrong = (
        make_repair(
            random.Random(f"{task_id}/repair"),
            header,
            spec.body,
            spec.name,
            [(_call(spec.name, a), repr(o)) for a, o in shown],
        )
        if repair
        else None
    )
    if wrong is not None:  # a wrong first attempt and what it showed: the warm start's repair traces
        metadata = {**metadata, "repair": wrong}
    doc = textwrap.fill(spec.doc, 76, initial_indent="    ", subsequent_indent="    ")
    examples = "".join(f"    >>> {_call(spec.name, a)}\n    {out!r}\n" for a, out in shown)
    prompt = f'{header}    """\n{doc}\n\n{examples}    """\n'
    tests = "def check(candidate):\n" + "".join(
        f"    assert candidate({', '.join(repr(a) for a in args)}) == {out!r}\n" for args, out in cases
    )
    return Task(
        task_id=task_id,
        prompt=prompt,
        entry_point=spec.name,
        tests=tests,
        reference=body,
        examples=[Example(call=_call(spec.name, a), expected=repr(out)) for a, out in shown],
        metadata={
            **metadata,
            **({"behaviour": spec.behaviour} if spec.behaviour else {}),
            **({"recipe": spec.recipe} if spec.recipe else {}),
        },
    )


def words(rng: Any, n: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz", lo: int = 1, hi: int = 7) -> list[str]:
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def ints(rng: Any, n: int, lo: int = -20, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]
