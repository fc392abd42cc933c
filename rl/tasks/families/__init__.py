"""Task families for `sarl tasks generate`: small Python functions, each at
3 difficulty levels, with hidden tests, a reference solution and visible
examples (rl.tasks.families.base). Eleven families have a few templates
each (`classic`); two compose programs from small operations and have
thousands (`composed`, rl.tasks.families.compose)."""

from __future__ import annotations

from rl.tasks.families import compose, numbers, parsing, structures, text
from rl.tasks.families.base import LEVELS, Family, Spec, SpecError, build

CLASSIC = [f for m in (text, numbers, structures, parsing) for f in m.FAMILIES]
FAMILIES: dict[str, Family] = {f.name: f for f in CLASSIC + compose.FAMILIES}
GROUPS: dict[str, list[str]] = {
    "all": list(FAMILIES),
    "classic": [f.name for f in CLASSIC],
    "composed": [f.name for f in compose.FAMILIES],
}
"""Names `--family` takes besides a family's own."""

__all__ = ["FAMILIES", "GROUPS", "LEVELS", "Family", "Spec", "SpecError", "build"]
