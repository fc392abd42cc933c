"""Repair traces: a wrong first attempt at a task, and what running it on the
visible examples showed, so that a warm start can teach the agent's
protocol whole: attempt, observation, fix.

`make_repair(rng, task_prompt, body, name, examples)` mutates a reference
(one small change to its syntax tree: a comparison or arithmetic operator,
a constant off by one, min for max, a sort's direction, a slice bound) and
keeps the first mutation, in a seeded order, that fails at least one
visible example. It runs the mutated code in this process, so it is only
for references this process wrote itself (generated tasks, whose
references `build()` already runs); references with a `while` loop or
recursion are skipped (a mutation could make them run forever).

What is stored (`Task.metadata["repair"]`) is the attempt's code and each
example's outcome, as rl.agent.observe's runner reports them; the
observation text is rendered from them at training time by the agent's
own `describe`, so that it is the text an episode would show.
"""

from __future__ import annotations

import ast
import copy
import textwrap
from collections.abc import Iterator
from typing import Any

_SWAPS: dict[type, type] = {
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.FloorDiv: ast.Mod,
    ast.Mod: ast.FloorDiv,
}
_NAMES = {"min": "max", "max": "min", "any": "all", "all": "any"}


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Every place one mutation can be made, with what it changes."""
    out: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            out += [(node, f"op{i}") for i, op in enumerate(node.ops) if type(op) in _SWAPS]
        elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _SWAPS:
            out.append((node, "op"))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append((node, "const"))
        elif isinstance(node, ast.Name) and node.id in _NAMES:
            out.append((node, "name"))
        elif isinstance(node, ast.keyword) and node.arg == "reverse" and isinstance(node.value, ast.Constant):
            out.append((node, "reverse"))
    return out


def _mutate(node: ast.AST, what: str) -> None:
    if what.startswith("op") and isinstance(node, ast.Compare):
        i = int(what[2:])
        node.ops[i] = _SWAPS[type(node.ops[i])]()
    elif what == "op" and isinstance(node, ast.BinOp | ast.AugAssign):
        node.op = _SWAPS[type(node.op)]()
    elif what == "const" and isinstance(node, ast.Constant) and isinstance(node.value, int):
        node.value = node.value + 1
    elif what == "name" and isinstance(node, ast.Name):
        node.id = _NAMES[node.id]
    elif what == "reverse" and isinstance(node, ast.keyword) and isinstance(node.value, ast.Constant):
        node.value = ast.Constant(not node.value.value)


def _outcome(fn: Any, examples: list[tuple[str, str]], ns: dict[str, Any]) -> list[list[Any]]:
    """Each example as the agent's runner reports it: [call, expected, what it gave, passed]."""
    rows = []
    for call, expected in examples:
        try:
            got = eval(call, ns)  # our own generated code (module docstring)
            rows.append([call, expected, repr(got)[:200], bool(got == eval(expected, dict(ns)))])
        except Exception as e:
            rows.append([call, expected, f"{type(e).__name__}: {str(e)[:150]}", False])
    return rows


def mutants(source: str, name: str, rng: Any, tries: int = 20) -> Iterator[str]:
    """`source` with one mutation each, for up to `tries` of its mutation
    sites in a seeded order, unparsed; nothing where it has a `while` loop
    or calls `name` (a mutation could make it run forever)."""
    tree = ast.parse(source)
    if any(isinstance(n, ast.While) for n in ast.walk(tree)) or any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(tree)
    ):
        return
    sites = _sites(tree)
    order = list(range(len(sites)))
    rng.shuffle(order)
    for i in order[:tries]:
        mutated = copy.deepcopy(tree)
        _mutate(_sites(mutated)[i][0], sites[i][1])
        yield ast.unparse(mutated)


def make_repair(rng: Any, header: str, body: str, name: str, examples: list[tuple[str, str]]) -> dict[str, Any] | None:
    """A first attempt that fails a visible example: {"attempt": the whole
    function, "examples": per-example outcome}; None when no mutation of the
    first 20 tried fails one (or the reference loops or recurses)."""
    source = header + textwrap.indent(body.strip("\n") + "\n", "    ")
    for code in mutants(source, name, rng):
        ns: dict[str, Any] = {}
        try:
            exec(compile(code, "attempt.py", "exec"), ns)
        except Exception:
            continue
        rows = _outcome(ns[name], examples, ns)
        if not all(r[3] for r in rows):
            return {"attempt": code, "examples": rows}
    return None
