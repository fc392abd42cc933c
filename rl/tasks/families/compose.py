"""Composed programs: thousands of templates from a few dozen small operations.

A task is a pipeline over one value: its input (a list of integers, or a
string), then N or N + 1 stages at level N, then an ending that gives the
result.
Each stage is an operation whose meaning is one precise phrase; the stages
are chained in the docstring ("first ..., then ..., finally return ...") and
in the reference (one statement each). Two tasks share a template exactly
when they chain the same operations (their constants aside), so the number
of templates is the number of chains: about 24^2 x 14 for two list stages.

What is refused, so that every task asks for a program of its own:
- a chain with an operation that undoes or repeats the one before it
  (reverse after reverse, a sort after a sort), or a stage without which
  the chain gives the same outputs on the probe inputs (a reversal before
  a sum);
- a chain whose outputs on the task's inputs are mostly empty or zero, or
  take fewer than 3 distinct values (a trivial answer would pass too often);
- a chain that behaves like another already drawn: `behaviour` is a hash of
  the outputs on fixed probe inputs, which rl.tasks.synthesis deduplicates.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from typing import Any

from rl.tasks.families.base import Family, Spec, SpecError, ints


@dataclass(frozen=True)
class Op:
    short: str
    """A name part: the entry point is the stages' short names joined."""
    phrase: str
    """What the stage does to `v` (str.format with the constants)."""
    code: str
    """One statement or expression over `v` (str.format with the constants)."""
    draw: Any = None
    """rng -> dict of constants, or None."""
    kind: str = "map"
    """`map` (v = code) or `end` (return code)."""
    family: str = ""
    """Operations of one family do not follow each other (two sorts, two reversals)."""


def _k(lo: int, hi: int, name: str = "k") -> Any:
    return lambda rng: {name: rng.randint(lo, hi)}


# ----------------------------------------------------------- lists of integers
LIST_MAPS = [
    Op("gt", "keep only the elements greater than {k}", "[x for x in v if x > {k}]", _k(-5, 20), family="keep"),
    Op("lt", "keep only the elements less than {k}", "[x for x in v if x < {k}]", _k(0, 30), family="keep"),
    Op("evens", "keep only the even elements", "[x for x in v if x % 2 == 0]", family="parity"),
    Op("odds", "keep only the odd elements", "[x for x in v if x % 2 != 0]", family="parity"),
    Op("nomult", "remove the elements divisible by {k}", "[x for x in v if x % {k} != 0]", _k(2, 9), "map", "mult"),
    Op("mult", "keep only the elements divisible by {k}", "[x for x in v if x % {k} == 0]", _k(2, 9), "map", "mult"),
    Op("add", "add {k} to every element", "[x + {k} for x in v]", _k(1, 30), family="shift"),
    Op("sub", "subtract {k} from every element", "[x - {k} for x in v]", _k(1, 30), family="shift"),
    Op("times", "multiply every element by {k}", "[x * {k} for x in v]", _k(2, 12), family="scale"),
    Op("sq", "replace every element by its square", "[x * x for x in v]", family="sign"),
    Op("abs", "replace every element by its absolute value", "[abs(x) for x in v]", family="sign"),
    Op("neg", "negate every element", "[-x for x in v]", family="sign"),
    Op(
        "mod",
        "replace every element x by x % {k} (Python's modulo: never negative)",
        "[x % {k} for x in v]",
        _k(2, 11),
        family="mod",
    ),  # fmt: skip
    Op("asc", "sort the elements in increasing order", "sorted(v)", family="order"),
    Op("desc", "sort the elements in decreasing order", "sorted(v, reverse=True)", family="order"),
    Op("rev", "reverse the order of the elements", "v[::-1]", family="order"),
    Op(
        "head", "keep only the first {k} elements (all of them when there are fewer)", "v[:{k}]", _k(1, 7), family="cut"
    ),  # fmt: skip
    Op("tail", "drop the first {k} elements (none is left when there are fewer)", "v[{k}:]", _k(1, 6), family="cut"),
    Op(
        "uniq", "remove repeated values, keeping the first occurrence of each", "list(dict.fromkeys(v))", family="uniq"
    ),  # fmt: skip
    Op(
        "cumsum",
        "replace the list by its running sums (element i becomes the sum of elements 0 to i)",
        "[sum(v[: i + 1]) for i in range(len(v))]",
        family="window",
    ),  # fmt: skip
    Op(
        "diffs",
        "replace the list by the differences of neighbours (element i becomes v[i + 1] - v[i]; a list "
        "of fewer than two elements becomes empty)",
        "[b - a for a, b in zip(v, v[1:])]",
        family="window",
    ),  # fmt: skip
    Op(
        "pairs",
        "replace the list by the sums of neighbours (element i becomes v[i] + v[i + 1]; a list of "
        "fewer than two elements becomes empty)",
        "[a + b for a, b in zip(v, v[1:])]",
        family="window",
    ),  # fmt: skip
    Op(
        "rot",
        "rotate the list left by {k} places (the first element moves to the end, {k} times; an empty list stays empty)",
        "v[{k} % len(v):] + v[:{k} % len(v)] if v else []",
        _k(1, 6),
        family="order",
    ),  # fmt: skip
    Op(
        "clamp",
        "clamp every element into the range {lo} to {hi} (smaller ones become {lo}, larger ones {hi})",
        "[min(max(x, {lo}), {hi}) for x in v]",
        lambda rng: {"lo": rng.randint(-5, 5), "hi": rng.randint(10, 25)},
        family="clamp",
    ),  # fmt: skip
    Op("even_pos", "keep the elements at even positions (0, 2, 4, ...)", "v[::2]", family="cut"),
]
LIST_ENDS = [
    Op("sum", "the sum of the elements (0 for an empty list)", "sum(v)", kind="end"),
    Op("len", "the number of elements", "len(v)", kind="end"),
    Op("max", "the largest element, or 0 for an empty list", "max(v, default=0)", kind="end"),
    Op("min", "the smallest element, or 0 for an empty list", "min(v, default=0)", kind="end"),
    Op("first", "the first element, or -1 for an empty list", "v[0] if v else -1", kind="end"),
    Op("last", "the last element, or -1 for an empty list", "v[-1] if v else -1", kind="end"),
    Op("distinct", "the number of distinct values", "len(set(v))", kind="end"),
    Op(
        "span",
        "the largest element minus the smallest, or 0 for an empty list",
        "max(v) - min(v) if v else 0",
        kind="end",
    ),  # fmt: skip
    Op(
        "argmax",
        "the position of the first largest element, or -1 for an empty list",
        "v.index(max(v)) if v else -1",
        kind="end",
    ),  # fmt: skip
    Op("positives", "how many elements are greater than 0", "sum(1 for x in v if x > 0)", kind="end"),
    Op(
        "altsum",
        "the alternating sum v[0] - v[1] + v[2] - ... (0 for an empty list)",
        "sum(x if i % 2 == 0 else -x for i, x in enumerate(v))",
        kind="end",
    ),  # fmt: skip
    Op("list", "the resulting list", "v", kind="end"),
    Op("sumsq", "the sum of the squares of the elements (0 for an empty list)", "sum(x * x for x in v)", kind="end"),
    Op(
        "ascending",
        "whether the elements are in non-decreasing order (True for fewer than two)",
        "all(a <= b for a, b in zip(v, v[1:]))",
        kind="end",
    ),  # fmt: skip
]


# --------------------------------------------------------------------- strings
def _char(rng: Any) -> dict[str, str]:
    return {"c": rng.choice("aeiorstn")}


STRING_MAPS = [
    Op("lower", "make every letter lowercase", "v.lower()", family="case"),
    Op("upper", "make every letter uppercase", "v.upper()", family="case"),
    Op("swap", "swap the case of every letter", "v.swapcase()", family="case"),
    Op("rev", "reverse the string", "v[::-1]", family="order"),
    Op(
        "novowel",
        "remove every vowel (a, e, i, o, u, in either case)",
        "''.join(ch for ch in v if ch.lower() not in 'aeiou')",
        family="drop",
    ),  # fmt: skip
    Op("letters", "keep only the letters", "''.join(ch for ch in v if ch.isalpha())", family="drop"),
    Op("nodigit", "remove every digit", "''.join(ch for ch in v if not ch.isdigit())", family="drop"),
    Op("nospace", "remove every space", "v.replace(' ', '')", family="drop"),
    Op(
        "dropc",
        "remove every '{c}' and '{C}'",
        "v.replace('{c}', '').replace('{C}', '')",
        lambda rng: {"c": (c := rng.choice("aeiorstn")), "C": c.upper()},
        family="drop",
    ),  # fmt: skip
    Op(
        "squeeze",
        "replace every run of equal neighbouring characters by one of them",
        "''.join(ch for i, ch in enumerate(v) if i == 0 or v[i - 1] != ch)",
        family="squeeze",
    ),  # fmt: skip
    Op("odd_pos", "keep the characters at even positions (0, 2, 4, ...)", "v[::2]", family="cut"),
    Op("double", "write every character twice", "''.join(ch * 2 for ch in v)", family="double"),
    Op(
        "rot",
        "rotate the string left by {k} places (an empty string stays empty)",
        "v[{k} % len(v):] + v[:{k} % len(v)] if v else ''",
        _k(1, 6),
        family="order",
    ),  # fmt: skip
    Op(
        "shift",
        "shift every lowercase letter {k} places forward in the alphabet, wrapping from z to a (other characters stay)",
        "''.join(chr((ord(ch) - 97 + {k}) % 26 + 97) if 'a' <= ch <= 'z' else ch for ch in v)",
        _k(1, 25),
        family="shift",
    ),  # fmt: skip
    Op("head", "keep only the first {k} characters", "v[:{k}]", _k(2, 12), family="cut"),
]
STRING_ENDS = [
    Op("len", "its length", "len(v)", kind="end"),
    Op(
        "vowels",
        "how many vowels (a, e, i, o, u, in either case) it has",
        "sum(1 for ch in v if ch.lower() in 'aeiou')",
        kind="end",
    ),  # fmt: skip
    Op("uppers", "how many uppercase letters it has", "sum(1 for ch in v if ch.isupper())", kind="end"),
    Op("digits", "how many digits it has", "sum(1 for ch in v if ch.isdigit())", kind="end"),
    Op("distinct", "how many distinct characters it has", "len(set(v))", kind="end"),
    Op("count", "how many times '{c}' occurs in it", "v.count('{c}')", _char, kind="end"),
    Op("str", "the resulting string", "v", kind="end"),
    Op(
        "words", "how many words it has (maximal runs of characters other than spaces)", "len(v.split())", kind="end"
    ),  # fmt: skip
    Op(
        "longest",
        "the length of its longest word (maximal run of characters other than spaces), or 0",
        "max((len(w) for w in v.split()), default=0)",
        kind="end",
    ),  # fmt: skip
    Op("palin", "whether it reads the same backwards", "v == v[::-1]", kind="end"),
    Op(
        "firstup",
        "the position of its first uppercase letter, or -1",
        "next((i for i, ch in enumerate(v) if ch.isupper()), -1)",
        kind="end",
    ),  # fmt: skip
]

# probe inputs: fixed, so that two chains that behave alike get one behaviour key
_PROBE_LISTS = [[], [0], [5], [-3, 7], [4, 4, 1], [9, -2, 6, 6, 13], [1, 2, 3, 4, 5, 6, 7], [30, -12, 8, 8, -1, 22],
                [17, 3, 3, 40, -6, 0, 11, 2], [-20, -7, 48, 15, 15, 15, 2, 9, 36]]  # fmt: skip
_PROBE_STRINGS = ["", "a", "Ab", "hello World", "aaBBcc dd", "Sarl 42 runs", "xyzzy Q", "The  quick Brown fox 7",
                  "eerie ocean AIR", "mm2 Nn3 oo"]  # fmt: skip
_ALPHABET = string.ascii_lowercase + string.ascii_uppercase[:6] + "     " + "0123456789"[:4]


def _draw_chain(
    rng: Any, maps: list[Op], ends: list[Op], level: int, ops: list[str] | None = None
) -> list[tuple[Op, dict[str, Any]]]:
    """A chain of level N (N or N + 1 stages and an ending); with `ops` (the
    short names of a chain's operations), that chain with new constants."""
    if ops is not None:
        by_name = {op.short: op for op in maps}
        ending = {op.short: op for op in ends}
        try:
            picked = [by_name[o] for o in ops[:-1]] + [ending[ops[-1]]]
        except KeyError as e:
            raise SpecError(f"recipe names an unknown operation {e}") from None
        return [(op, op.draw(rng) if op.draw else {}) for op in picked]
    chain: list[tuple[Op, dict[str, Any]]] = []
    stages = level + rng.randint(0, 1)  # level N: N or N + 1 stages
    while len(chain) < stages:
        op = rng.choice(maps)
        if chain and (op.family == chain[-1][0].family or op.short == chain[-1][0].short):
            continue  # undoes or repeats the stage before
        chain.append((op, op.draw(rng) if op.draw else {}))
    end = rng.choice(ends)
    chain.append((end, end.draw(rng) if end.draw else {}))
    return chain


def _body(chain: list[tuple[Op, dict[str, Any]]], param: str) -> str:
    end_op, end_c = chain[-1]
    stages = "".join(f"v = {op.code.format(**c)}\n" for op, c in chain[:-1])
    return f"v = {param}\n" + stages + f"return {end_op.code.format(**end_c)}"


def _spec(chain: list[tuple[Op, dict[str, Any]]], param: str, what: str, returns: str, inputs: list[Any]) -> Spec:
    stages = [op.phrase.format(**c) for op, c in chain[:-1]]
    end_op, end_c = chain[-1]
    steps = "; then ".join(stages)
    doc = f"Take {what}. First {steps}; finally return {end_op.phrase.format(**end_c)}."
    body = _body(chain, param)
    name = "_".join(op.short for op, _ in chain)
    kind = "list[int]" if param == "xs" else "str"
    return Spec(name, f"{param}: {kind}", returns, doc, body, [(x,) for x in inputs])


def _returns(end: Op, kind: str) -> str:
    if end.short == "list":
        return "list[int]"
    if end.short == "str":
        return "str"
    if end.short in ("ascending", "palin"):
        return "bool"
    return "int"


def _run(params: str, body: str, args: list[Any]) -> list[Any]:
    ns: dict[str, Any] = {}
    exec(f"def f({params}):\n" + "".join(f"    {ln}\n" for ln in body.splitlines()), ns)  # our own code
    return [ns["f"](a) for a in args]


def _check(spec: Spec, chain: list[tuple[Op, dict[str, Any]]], param: str, probes: list[Any]) -> str:
    """Refuse a chain with a stage that changes nothing (reverse before a
    sum), or whose outputs are mostly empty or take few values; return its
    behaviour key."""
    try:
        outs = _run(spec.params, spec.body, [a for (a,) in spec.inputs])
        probe_outs = _run(spec.params, spec.body, probes)
        for i in range(len(chain) - 1):
            shorter = _body(chain[:i] + chain[i + 1 :], param)
            if _run(spec.params, shorter, probes) == probe_outs:
                raise SpecError(f"{spec.name}: stage {chain[i][0].short} changes nothing")
    except SpecError:
        raise
    except Exception as e:
        raise SpecError(f"{spec.name}: {e!r}") from None
    if len({repr(o) for o in outs}) < 3 or sum(o in (0, "", [], -1, False) for o in outs) > len(outs) // 2:
        raise SpecError(f"{spec.name}: outputs too uniform")
    if all(o == a for o, (a,) in zip(outs, spec.inputs, strict=True)):
        raise SpecError(f"{spec.name}: returns its input")
    return hashlib.sha256(repr(probe_outs).encode()).hexdigest()[:16]


def list_pipelines(rng: Any, level: int, recipe: dict[str, Any] | None = None) -> Spec:
    chain = _draw_chain(rng, LIST_MAPS, LIST_ENDS, level, None if recipe is None else recipe["ops"])
    inputs = [ints(rng, rng.randint(0 if i == 0 else 3, 9)) for i in range(10)]
    spec = _spec(chain, "xs", "xs, a list of integers, as v", _returns(chain[-1][0], "list"), inputs)
    spec.behaviour = _check(spec, chain, "xs", _PROBE_LISTS)
    spec.recipe = {"ops": [op.short for op, _ in chain]}
    return spec


def string_pipelines(rng: Any, level: int, recipe: dict[str, Any] | None = None) -> Spec:
    chain = _draw_chain(rng, STRING_MAPS, STRING_ENDS, level, None if recipe is None else recipe["ops"])
    inputs = ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0 if i == 0 else 4, 16))) for i in range(10)]
    spec = _spec(chain, "s", "s, a string, as v", _returns(chain[-1][0], "str"), inputs)
    spec.behaviour = _check(spec, chain, "s", _PROBE_STRINGS)
    spec.recipe = {"ops": [op.short for op, _ in chain]}
    return spec


FAMILIES = [
    Family(
        "list_pipelines",
        "composed programs over a list of integers: 1-4 of 25 stages and one of 14 endings",
        list_pipelines,
        list_pipelines,
    ),  # fmt: skip
    Family(
        "string_pipelines",
        "composed programs over a string: 1-4 of 15 stages and one of 11 endings",
        string_pipelines,
        string_pipelines,
    ),  # fmt: skip
]
