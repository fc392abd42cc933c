"""Text-transform tasks: rewrite a short text as an instruction asks (reverse
the words, sort them, drop repeats, change case, ...), answered in the reply
itself and graded with partial credit: the LCS ratio of the answer to the
expected text (difflib's SequenceMatcher ratio, as prime-rl's reverse-text
environment grades). They are the positive control of learning: a pipeline
whose RL does not raise this reward far beyond its control is broken,
whatever code tasks show.

A transform is a template; its instances are texts drawn from a fixed
vocabulary, as many as wanted (`text_tasks(transforms, n, seed)`), each
with its own expected answer. The task's `tests` is JSON: the expected text.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from rl.tasks.format import Task

WORDS = tuple(
    "apple river stone cloud green paper light music table window garden silver bright quiet "  # noqa: SIM905
    "orange yellow purple little summer winter forest mountain ocean desert island valley "
    "bread water coffee butter honey salt pepper sugar lemon cherry grape melon peach "
    "horse tiger rabbit eagle whale snake mouse zebra panda otter camel goat sheep "
    "happy simple gentle clever brave calm proud swift warm cold early late "
    "north south east west under over before after inside outside between around "
    "pencil rocket bottle candle mirror ladder basket wallet button pillow blanket kettle".split()
)


@dataclass(frozen=True)
class Transform:
    name: str
    instruction: str
    apply: Callable[[list[str]], str]


def _dedupe(ws: list[str]) -> list[str]:
    return list(dict.fromkeys(ws))


TRANSFORMS: dict[str, Transform] = {
    t.name: t
    for t in (
        Transform("reverse-words", "Reverse the order of the words.", lambda ws: " ".join(ws[::-1])),
        Transform("sort-words", "Sort the words in alphabetical order.", lambda ws: " ".join(sorted(ws))),
        Transform(
            "dedupe-words",
            "Remove every repeated word, keeping only the first occurrence of each word.",
            lambda ws: " ".join(_dedupe(ws)),
        ),
        Transform("upper-case", "Write every word in upper case.", lambda ws: " ".join(w.upper() for w in ws)),
        Transform(
            "capitalize-words",
            "Capitalize the first letter of every word.",
            lambda ws: " ".join(w.capitalize() for w in ws),
        ),
        Transform(
            "reverse-letters",
            "Reverse the letters of each word, keeping the words in their order.",
            lambda ws: " ".join(w[::-1] for w in ws),
        ),
        Transform(
            "first-and-last",
            "Keep only the first and the last word.",
            lambda ws: f"{ws[0]} {ws[-1]}",
        ),
        Transform(
            "comma-list",
            "Join the words with a comma and a space between them.",
            lambda ws: ", ".join(ws),
        ),
    )
}
"""Every transform, by name (the template of its tasks)."""


def _draw(rng: random.Random, t: Transform) -> list[str]:
    """Words the transform changes: a text already sorted (or with nothing to
    remove, or a palindrome of words) is passed by copying it, and teaches nothing."""
    while True:
        ws = [rng.choice(WORDS) for _ in range(rng.randint(4, 8))]
        if t.name == "dedupe-words" and len(set(ws)) == len(ws):
            ws.insert(rng.randint(1, len(ws)), rng.choice(ws))
        if t.apply(ws) != " ".join(ws):
            return ws


def text_task(name: str, seed: int, index: int) -> Task:
    """Instance `index` of transform `name`, drawn from `seed`."""
    t = TRANSFORMS[name]
    rng = random.Random(f"text/{name}/{seed}/{index}")
    ws = _draw(rng, t)
    text = " ".join(ws)
    expected = t.apply(ws)
    return Task(
        task_id=f"text/{name}/s{seed}-{index:05d}",
        prompt=f"{t.instruction}\n\nText: {text}",
        entry_point="answer",
        tests=json.dumps({"expected": expected}),
        test_format="text",
        environment="text",
        reference=expected,
        metadata={"source": "generated", "family": "text", "template": name, "seed": seed},
    )


def text_tasks(names: list[str], n: int, seed: int) -> list[Task]:
    """`n` tasks, round-robin over the transforms `names`, each text distinct."""
    unknown = sorted(set(names) - set(TRANSFORMS))
    if unknown:
        raise ValueError(f"unknown text transform(s) {unknown}; they are {sorted(TRANSFORMS)}")
    out: list[Task] = []
    seen: set[str] = set()
    i = 0
    while len(out) < n:
        task = text_task(names[len(out) % len(names)], seed, i)
        i += 1
        if task.prompt not in seen:
            seen.add(task.prompt)
            out.append(task)
    return out


def expected_text(task: Task) -> str:
    """A text task's expected answer (its tests); ValueError when they are not that."""
    try:
        spec = json.loads(task.tests)
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or not isinstance(spec.get("expected"), str):
        raise ValueError('tests: a text task\'s tests are {"expected": TEXT}')
    return str(spec["expected"])
