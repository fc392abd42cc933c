"""Fresh instances of a template, and what an instance shares with another.

A template (rl.tasks.leakage.template) is what a task asks, its constants
aside; an instance is one task of it, with its own constants and inputs.
Learning is measured on fresh instances of the templates RL trained on (the
task set B' of docs/tasks.md): tasks that ask the same kind of thing with
other parameters, none of which any training file holds.

`fresh(like, n, seed, avoid)` draws them: a composed family (and the text
transforms) remakes the template from its recipe with new constants; a
family of few templates is drawn until it gives that template again. An
instance is fresh when it shares nothing at the instance level
(`instance_leaks`) with `avoid` or with the instances drawn before it.

The instance level, checked for every pair of a training and a held task:
- **prompt**: the same prompt, once whitespace is normalised;
- **reference**: the same reference program (rl.tasks.leakage.reference_program:
  equal ASTs, constants included; a workspace's, its function's body);
- **behaviour**: the same outputs on the family's probe inputs (the same
  function written differently; a workspace built from a generated function
  carries that function's);
- **near-duplicate**: the whole prompts' MinHash signatures (examples and
  constants included) agree on at least `threshold` (0.9) of their values.
A workspace task's prompt is its instruction and its function as the module
shows it, docstring examples included: the instruction alone names only a
function and a path.
Other instances of one template differ in their constants and examples, so
the template-level check (which masks constants and ignores examples) finds
them and this one does not.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from rl.tasks.dedup import minhash, words
from rl.tasks.format import Task
from rl.tasks.leakage import Leak, LeakReport, reference_program, template, workspace_function

KINDS = ("prompt", "reference", "behaviour", "near-duplicate")
"""The kinds of leak at the instance level."""
ATTEMPTS = 400
"""Draws per instance asked for, at most."""
STALL = 200
"""Draws of the template in a row whose reference program is already taken,
after which it is taken to have no program left (a template without
constants has one: the check that was spending all ATTEMPTS on it). Where
even 2% of its programs were still new, 200 such draws in a row come with
probability 0.018."""
NEAR = 0.9
"""Estimated Jaccard of two whole prompts at which they are one instance."""


@dataclass
class Keys:
    """What identifies instances, for the leak check."""

    prompts: dict[str, str] = field(default_factory=dict)
    programs: dict[str, str] = field(default_factory=dict)
    behaviours: dict[str, str] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)
    sigs: list[np.ndarray] = field(default_factory=list)
    _matrix: np.ndarray | None = None

    def add(self, t: Task) -> None:
        self.prompts.setdefault(_prompt(t), t.task_id)
        p = reference_program(t)
        if p is not None:
            self.programs.setdefault(p, t.task_id)
        b = t.metadata.get("behaviour")
        if b:
            self.behaviours.setdefault(str(b), t.task_id)
        self.ids.append(t.task_id)
        self.sigs.append(_signature(t))
        self._matrix = None

    def leaks(self, h: Task, threshold: float = NEAR) -> list[Leak]:
        out = []
        if _prompt(h) in self.prompts:
            out.append(Leak(h.task_id, self.prompts[_prompt(h)], "prompt"))
        p = reference_program(h)
        if p is not None and p in self.programs:
            out.append(Leak(h.task_id, self.programs[p], "reference"))
        b = h.metadata.get("behaviour")
        if b and str(b) in self.behaviours:
            out.append(Leak(h.task_id, self.behaviours[str(b)], "behaviour"))
        if self.sigs:
            if self._matrix is None:
                self._matrix = np.stack(self.sigs)
            agree = (self._matrix == _signature(h)[None, :]).mean(axis=1)
            i = int(np.argmax(agree))
            if agree[i] >= threshold:
                out.append(Leak(h.task_id, self.ids[i], "near-duplicate", f"estimated Jaccard {agree[i]:.2f}"))
        return out


def _shown(t: Task) -> str:
    """What the task shows the model: its prompt and, for a workspace, its
    function as the module shows it (the instruction alone names a function
    and a path; the docstring and its examples are the instance)."""
    fn = workspace_function(t)
    return t.prompt if fn is None else f"{t.prompt}\n{fn}"


def _prompt(t: Task) -> str:
    return re.sub(r"\s+", " ", _shown(t)).strip()


def _signature(t: Task) -> np.ndarray:
    text = _shown(t)
    return minhash(text, 3, tokens=words(text))


def instance_leaks(train: Iterable[Task], held: list[Task], threshold: float = NEAR) -> LeakReport:
    """Every way each held task is an instance some training task already is."""
    train = list(train)
    keys = Keys()
    for t in train:
        keys.add(t)
    report = LeakReport(len(train), len(held), threshold=threshold, kinds=KINDS)
    for h in held:
        report.leaks += keys.leaks(h, threshold)
    return report


def fresh(like: Task, n: int, seed: int, avoid: Iterable[Task] = (), keys: Keys | None = None) -> list[Task]:
    """Up to `n` new instances of `like`'s template, each fresh against
    `avoid` (and `keys`, which it extends with them) and against each other.
    Fewer when the template has no more: ATTEMPTS draws an instance, or STALL
    draws in a row of programs already taken (a template without constants
    has one program). Their ids are `like`'s with `/fresh-SEED-I`."""
    if keys is None:
        keys = Keys()
        for t in avoid:
            keys.add(t)
    want = template(like)
    out: list[Task] = []
    taken = 0  # draws of the template in a row whose program is taken
    for attempt in range(ATTEMPTS * n):
        if len(out) == n or taken == STALL:
            break
        seeded = f"fresh/{like.task_id}/{seed}/{attempt}"
        task_id = f"{like.task_id}/fresh-{seed}-{len(out)}"
        task = _draw(like, random.Random(seeded), task_id, repair=False)
        if task is None or template(task) != want:
            continue
        leaks = keys.leaks(task)
        taken = taken + 1 if any(x.kind == "reference" for x in leaks) else 0
        if leaks:
            continue
        task = _draw(like, random.Random(seeded), task_id)  # the same task, with its repair trace
        assert task is not None
        keys.add(task)
        out.append(task)
    return out


def _draw(like: Task, rng: random.Random, task_id: str, repair: bool = True) -> Task | None:
    """One more task of `like`'s family and level (of its template, from its
    recipe, where the family has one); None when the draw is refused.
    `repair`: with the repair trace's wrong first attempt (families.build)."""
    meta = like.metadata
    if meta.get("family") == "text":
        from rl.tasks.texts import text_task

        t = text_task(str(meta["template"]), rng.randrange(2**31), rng.randrange(2**20))
        return t.model_copy(update={"task_id": task_id})
    from rl.tasks.families import FAMILIES, SpecError, build

    fam = FAMILIES.get(str(meta.get("family", "")))
    level = meta.get("difficulty")
    if fam is None or not isinstance(level, int):
        return None
    try:
        recipe = meta.get("recipe")
        spec = fam.remake(rng, level, recipe) if fam.remake is not None and recipe else fam.make(rng, level)
        keep = {k: v for k, v in meta.items() if k not in ("behaviour", "recipe", "repair")}
        return build(spec, task_id, {**keep, "fresh_of": like.task_id}, repair)
    except SpecError:
        return None
