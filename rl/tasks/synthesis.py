"""Synthesised tasks (`sarl tasks generate`) and deterministic splits (`sarl tasks split`).

Synthesis round-robins over the chosen families and levels. Task i is
drawn from a random stream seeded by (seed, family, level, i, attempt), so
a seed gives the same file on any machine, and a task does not change when
`-n` grows. A draw that duplicates an earlier task (the same normalised
prompt and tests, or a near-duplicate by MinHash, as validation judges)
or whose reference cannot make a task is drawn again, a bounded number of
times. Each task's metadata records its source, family, level and seed.

The split is stratified by (family, level) when tasks have them, so the
held-out part has every kind of task in proportion.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from rl.errors import SarlError
from rl.tasks.dedup import minhash, normalise
from rl.tasks.families import FAMILIES, GROUPS, LEVELS, SpecError, build
from rl.tasks.format import Task

ATTEMPTS = 200


class SynthesisError(SarlError, ValueError):
    exit_code = 2


class _Distinct:
    """Exact and near duplicates of everything accepted so far."""

    def __init__(self, threshold: float = 0.8):
        self.keys: set[str] = set()
        self.sigs: list[np.ndarray] = []
        self.behaviours: set[str] = set()
        self.threshold = threshold

    def add(self, t: Task) -> bool:
        key = normalise(t.prompt) + "\0" + normalise(t.tests)
        behaviour = t.metadata.get("behaviour")
        if key in self.keys or (behaviour is not None and behaviour in self.behaviours):
            return False  # the same text, or the same program (outputs on the family's probe inputs)
        sig = minhash(t.prompt + "\n" + t.tests)
        if any(float(np.mean(sig == s)) >= self.threshold for s in self.sigs):
            return False
        self.keys.add(key)
        self.sigs.append(sig)
        if behaviour is not None:
            self.behaviours.add(behaviour)
        return True


def synthesize(family: str, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
    if family not in GROUPS and family not in FAMILIES:
        raise SynthesisError(
            f"--family {family!r}: not a family; choose {', '.join(map(repr, GROUPS))} or one of {', '.join(FAMILIES)}"
        )
    if difficulty is not None and difficulty not in LEVELS:
        raise SynthesisError(f"--difficulty {difficulty}: levels are {', '.join(map(str, LEVELS))}")
    if n < 1:
        raise SynthesisError(f"-n {n}: generate at least one task")
    families = [FAMILIES[f] for f in GROUPS[family]] if family in GROUPS else [FAMILIES[family]]
    levels = [difficulty] if difficulty is not None else list(LEVELS)
    combos = [(f, lvl) for lvl in levels for f in families]
    seen = _Distinct()
    out: list[Task] = []
    for i in range(n):
        fam, level = combos[i % len(combos)]
        for attempt in range(ATTEMPTS):
            rng = random.Random(f"{seed}/{fam.name}/{level}/{i}/{attempt}")
            task_id = f"gen/{fam.name}/L{level}/s{seed}-{i:05d}"
            meta: dict[str, Any] = {"source": "generated", "family": fam.name, "difficulty": level, "seed": seed}
            try:
                task = build(fam.make(rng, level), task_id, meta)
            except SpecError:
                continue
            if seen.add(task):
                out.append(task)
                break
        else:
            raise SynthesisError(
                f"family {fam.name} at level {level}: no new distinct task in {ATTEMPTS} draws after "
                f"{len(out)} tasks; ask for fewer"
            )
    return out
