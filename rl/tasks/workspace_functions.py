"""Workspace tasks built from generated function tasks (rl.tasks.synthesis):
one package module per function, in the three kinds of rl.tasks.workspaces
(fix, implement, make-pass).

The module is the function task's prompt (signature and docstring, its
examples included) over the reference body; the planted bug is the task's
repair attempt (rl.tasks.repairs: one small mutation that fails a visible
example); the calls are the hidden tests' inputs, the first three visible
in tests/. A function whose mutation passes the visible tests, or that has
none, gives only the implement task.

Held out by template: every task built from one function template has the
function task's template key (rl.tasks.leakage.template reads the module's
docstring), so that `sarl tasks split` keeps the three kinds of a function,
and the function task itself, on one side.
"""

from __future__ import annotations

import ast
import hashlib

from rl.tasks.format import Task
from rl.tasks.leakage import template
from rl.tasks.synthesis import synthesize
from rl.tasks.workspaces import Unit, build_tasks, failing_visible


def _calls(task: Task) -> tuple[str, ...]:
    """The argument lists of the hidden asserts `candidate(ARGS) == WANT`."""
    check = next(n for n in ast.parse(task.tests).body if isinstance(n, ast.FunctionDef))
    out = []
    for node in check.body:
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
            call = node.test.left
            if isinstance(call, ast.Call):
                out.append(", ".join([ast.unparse(a) for a in call.args] + [ast.unparse(k) for k in call.keywords]))
    return tuple(out)


def _body(function_source: str) -> str:
    """The body of a one-function source, as it is indented there."""
    lines = function_source.strip("\n").splitlines()
    return "\n".join(lines[1:]) + "\n"


def unit_of(task: Task) -> Unit:
    """The workspace unit of a generated function task."""
    tree = ast.parse(task.prompt + task.reference)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == task.entry_point)
    header = task.prompt.lstrip().splitlines()[0]  # def name(params) -> returns:
    signature = header[len(f"def {fn.name}") : header.rindex(":")]
    doc = ast.get_docstring(fn, clean=False) or ""
    attempt = (task.metadata.get("repair") or {}).get("attempt")
    unit = Unit(
        package=f"{str(task.metadata['family']).replace('-', '_')}_kit",
        module=fn.name,
        func=fn.name,
        signature=signature,
        doc=doc,
        body=task.reference if task.reference.endswith("\n") else task.reference + "\n",
        bugs=(_body(attempt),) if attempt else (),
        calls=_calls(task),
        difficulty=int(task.metadata.get("difficulty", 1)),
    )
    if unit.bugs:
        try:
            failing_visible(unit, unit.bugs[0])
        except ValueError:  # the mutation passes the visible tests: no fix to ask for
            unit = Unit(**{**unit.__dict__, "bugs": ()})
    return unit


def function_workspaces(seed: int = 0, functions: int = 90) -> list[Task]:
    """Workspace tasks from `functions` generated function tasks (all
    families and levels, `seed`): three a function where its repair attempt
    fails a visible test, else one."""
    out: list[Task] = []
    for fn in synthesize("all", functions, seed):
        key = hashlib.sha256(template(fn).encode()).hexdigest()[:10]
        built = build_tasks(
            unit_of(fn),
            source="sarl-workspace-generated",
            template_key=f"workspace/{fn.metadata['family']}/{key}",
            task_key=fn.task_id.removeprefix("gen/"),
        )
        # the function's outputs on its family's probe inputs: the instance-level
        # leak check (rl.tasks.instances) finds the same function written otherwise
        if behaviour := fn.metadata.get("behaviour"):
            built = [t.model_copy(update={"metadata": {**t.metadata, "behaviour": behaviour}}) for t in built]
        out += built
    return out
