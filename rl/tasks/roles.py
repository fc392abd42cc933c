"""Task sets by role, each leak-checked (`sarl tasks sets`, `sarl tasks band`).

    A    the warm start's tasks (SFT on their references)
    B    the RL tasks: instances the warm start never saw, of templates chosen
         by the warm start's measured pass rate (`band`): templates of A on
         other instances ("seen"), or templates the warm start never saw ("new")
    B'   fresh instances of B's templates: other constants, and no prompt,
         reference program, behaviour or near-duplicate prompt that any
         training file holds (rl.tasks.instances)
    U    whole templates no run trains on

`make_sets` splits a generated file: U by whole templates (rl.tasks.split),
then of the other templates a share `new` is kept from A; the candidates
for B are fresh instances of every other template (seen and new alike).
`band` keeps the candidates' templates whose measured pass rate lies in the
band, and draws B' for them. A template that has no fresh instance (one
without constants has one program) cannot be in B: its B' would repeat B;
nor can one with fewer than B' takes, so `sets --fresh` leaves such
templates out of the candidates before anything measures them.

Learning is then claimed on B' (instances) and checked on U (templates):
`sarl tasks leaks` checks A + B against U for templates, and every
training file against B' and U for instances.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.errors import SarlError
from rl.tasks.format import LineErrors, Task
from rl.tasks.instances import Keys, fresh
from rl.tasks.leakage import template
from rl.tasks.split import split_tasks


class SetsError(SarlError, ValueError):
    exit_code = 2


@dataclass
class Sets:
    a: list[Task]
    u: list[Task]
    candidates: list[Task]
    """Fresh instances of every template outside U, each marked `seen` or `new` (to A)."""
    templates: dict[str, int] = field(default_factory=dict)
    """Templates by where they went: u, seen (in A), new (kept from A), short
    (fewer fresh instances left than the candidates and B' need)."""


def make_sets(tasks: list[Task], held_out: float, new: float, per_template: int, seed: int, reserve: int = 0) -> Sets:
    """U (whole templates, `held_out` of the tasks), A, and `per_template`
    candidate instances of every other template; `new` of the other
    templates are kept from A. A template is a candidate only if `reserve`
    more fresh instances are left to draw (`band --fresh`, B'): one short of
    them would be measured by the band's eval, the dearest step, and then
    dropped."""
    if not 0.0 <= new < 1.0:
        raise SetsError(f"--new {new}: a fraction in [0, 1)")
    if per_template < 1:
        raise SetsError(f"--candidates {per_template}: at least one instance a template")
    if reserve < 0:
        raise SetsError(f"--fresh {reserve}: a number of fresh instances, 0 or more")
    s = split_tasks(tasks, held_out, seed)
    u, rest = s.held, s.train
    by: dict[str, list[Task]] = defaultdict(list)
    for t in rest:
        by[template(t)].append(t)
    keys = sorted(by)
    random.Random(f"{seed}/sets/new").shuffle(keys)
    fresh_keys = set(keys[: int(round(new * len(keys)))])
    a = [t for t in rest if template(t) not in fresh_keys]
    avoid = Keys()
    for t in tasks:
        avoid.add(t)
    candidates: list[Task] = []
    counts = {"u": len({template(t) for t in u}), "seen": 0, "new": 0, "short": 0}
    for key in sorted(by):
        # the reserve is only counted: band draws B' again, against the candidates, A and U
        got = fresh(by[key][0], per_template + reserve, seed, keys=avoid)
        if len(got) < per_template + reserve:
            counts["short"] += 1
            continue
        got = got[:per_template]
        kind = "new" if key in fresh_keys else "seen"
        counts[kind] += 1
        candidates += [t.model_copy(update={"metadata": {**t.metadata, "to_warm_start": kind}}) for t in got]
    if not a or not candidates:
        raise SetsError(
            f"{len(tasks)} tasks give {len(a)} warm-start tasks and {len(candidates)} RL candidates: "
            "generate more tasks, or hold fewer templates out"
        )
    return Sets(a, u, candidates, counts)


@dataclass
class Band:
    b: list[Task]
    b_fresh: list[Task]
    rates: dict[str, float]
    """Each candidate template's measured pass rate (the mean over its instances and samples)."""
    kept: list[str]
    """The templates in the band, with fresh instances for B'."""
    kinds: dict[str, int] = field(default_factory=dict)
    """Kept templates by kind: seen (in A) or new to the warm start."""


def band(
    candidates: list[Task],
    pass_rates: dict[str, float],
    low: float,
    high: float,
    per_template: int,
    seed: int,
    avoid: list[Task],
) -> Band:
    """B: the candidates of the templates whose mean pass rate over their
    measured instances is within [low, high]; B': `per_template` fresh
    instances of each, none an instance of `avoid`, B or another B' task."""
    check_band(low, high, per_template)
    by: dict[str, list[Task]] = defaultdict(list)
    for t in candidates:
        by[template(t)].append(t)
    rates: dict[str, float] = {}
    for key, ts in by.items():
        measured = [pass_rates[t.task_id] for t in ts if t.task_id in pass_rates]
        if measured:
            rates[key] = sum(measured) / len(measured)
    if not rates:
        raise SetsError("no candidate has a measured pass rate: give the results of `sarl eval` on the candidates")
    keys = Keys()
    for t in [*avoid, *candidates]:
        keys.add(t)
    b: list[Task] = []
    b_fresh: list[Task] = []
    kept: list[str] = []
    kinds: dict[str, int] = {"seen": 0, "new": 0}
    for key in sorted(k for k, r in rates.items() if low <= r <= high):
        got = fresh(by[key][0], per_template, seed + 1, keys=keys)
        if len(got) < per_template:
            continue  # too few programs left to hold some out
        kept.append(key)
        kind = str(by[key][0].metadata.get("to_warm_start", "seen"))
        kinds[kind] = kinds.get(kind, 0) + 1
        b += by[key]
        b_fresh += got
    if not kept:
        raise SetsError(
            f"no candidate template has a pass rate in [{low}, {high}] and {per_template} fresh instances "
            f"(measured rates: {_spread(rates)})"
        )
    return Band(b, b_fresh, rates, kept, kinds)


def _spread(rates: dict[str, float]) -> str:
    v = sorted(rates.values())
    return f"{len(v)} templates, min {v[0]:.2f}, median {v[len(v) // 2]:.2f}, max {v[-1]:.2f}"


def check_band(low: float, high: float, per_template: int) -> None:
    """The band's bounds and B's fresh instances a template, checked before
    any file is read."""
    if not 0.0 <= low < high <= 1.0:
        raise SetsError(f"--band {low} {high}: 0 <= low < high <= 1")
    if per_template < 1:
        raise SetsError(f"--fresh {per_template}: at least one fresh instance a template (B' holds them)")


def read_rates(path: Path, by: str = "pass") -> dict[str, float]:
    """Each task's measured rate, from a `sarl eval` results.jsonl (or the
    folder that holds it): `pass`, its samples that passed over its samples;
    `reward`, its mean reward (partial credit, as text tasks grade: an exact
    answer may be rare long after the reward has signal). A TaskError names
    every bad line."""
    if by not in ("pass", "reward"):
        raise SetsError(f"--by {by}: pass or reward")
    path = path / "results.jsonl" if path.is_dir() else path
    errors = LineErrors(path)
    rates: dict[str, float] = {}
    for n, r in errors.objects():
        task_id = r.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            errors.add(n, "task_id: required string field is missing (a line of `sarl eval`'s results.jsonl)")
            continue
        if not errors.new_task_id(n, task_id):
            continue
        rate = _rate(r, by)
        if isinstance(rate, str):
            errors.add(n, rate)
        else:
            rates[task_id] = rate
    errors.raise_any()
    return rates


def _rate(r: dict[str, Any], by: str) -> float | str:
    """A result line's rate, or what is wrong with it."""
    if by == "reward":
        mean = r.get("reward_mean")
        if isinstance(mean, bool) or not isinstance(mean, int | float) or not 0.0 <= mean <= 1.0:
            return f"reward_mean: a number from 0 to 1 is required to band --by reward, got {mean!r}"
        return float(mean)
    passed, n = r.get("passed"), r.get("n")
    if passed is None and n is None:
        return "passed, n: missing: not a line of `sarl eval`'s results.jsonl"
    if type(passed) is not int or type(n) is not int or not 0 <= passed <= n or n < 1:  # bool is no count
        return f"passed, n: whole numbers with 0 <= passed <= n and n >= 1 are required, got {passed!r}, {n!r}"
    return passed / n


def with_signal(results: list[dict[str, Any]], by: str = "pass") -> int:
    """The tasks whose samples disagree, from a `sarl eval` results.jsonl: by
    `pass`, some passed and some did not; by `reward`, a mean strictly between
    0 and 1 (a per-sample spread is not in the results; partial credit makes
    a mean inside (0, 1) nearly always a spread). A group of RL samples of
    such a task has an advantage that is not zero everywhere."""
    if by == "reward":
        return sum(1 for r in results if 0.0 < float(r["reward_mean"]) < 1.0)
    return sum(1 for r in results if 0 < int(r["passed"]) < int(r["n"]))
