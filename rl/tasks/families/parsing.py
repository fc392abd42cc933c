"""Families that parse small text formats."""

from __future__ import annotations

from typing import Any

from rl.tasks.families.base import Family, Spec


def parsing(rng: Any, level: int) -> Spec:
    if level == 1:
        pair, sep = rng.choice([(";", "="), (",", ":"), ("&", "=")])
        keys = "abcdefg"

        def text() -> str:
            n = rng.randint(0, 4)
            return pair.join(f"{rng.choice(keys)}{sep}{rng.randint(-9, 99)}" for _ in range(n))

        return Spec(
            "parse_pairs", "s: str", "dict[str, int]",
            f"Parse s, a list of key{sep}value items separated by {pair!r} (values are integers), into a dict. "
            "A key that appears again keeps its last value; the empty string gives {}.",
            f"out = {{}}\nfor item in s.split({pair!r}):\n    if item:\n        k, v = item.split({sep!r})\n"
            "        out[k] = int(v)\nreturn out",
            [(text(),) for _ in range(8)],
        )  # fmt: skip
    if level == 2:

        def clock() -> str:
            return ",".join(f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}" for _ in range(rng.randint(1, 4)))

        return Spec(
            "total_minutes", "s: str", "int",
            "s holds times of day as HH:MM separated by commas. Return the total number of minutes after "
            "midnight of all of them added together.",
            "return sum(int(t[:2]) * 60 + int(t[3:]) for t in s.split(','))",
            [(clock(),) for _ in range(8)],
        )  # fmt: skip

    def ranges() -> str:
        parts = []
        for _ in range(rng.randint(1, 4)):
            a = rng.randint(0, 30)
            parts.append(str(a) if rng.random() < 0.4 else f"{a}-{a + rng.randint(0, 4)}")
        return ",".join(parts)

    return Spec(
        "expand_ranges", "s: str", "list[int]",
        "s lists numbers and inclusive ranges separated by commas, e.g. '1-3,7'. Return every number they "
        "cover, each once, sorted ascending.",
        "out = set()\nfor part in s.split(','):\n    if '-' in part:\n        a, b = part.split('-')\n"
        "        out.update(range(int(a), int(b) + 1))\n    else:\n        out.add(int(part))\nreturn sorted(out)",
        [(ranges(),) for _ in range(8)],
    )  # fmt: skip


FAMILIES = [Family("parsing", "key-value items, clock times, number ranges", parsing)]
