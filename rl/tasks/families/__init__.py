"""Task families for `sarl tasks generate`: small Python functions in 11
families, each at 3 difficulty levels, with hidden tests, a reference
solution and visible examples (rl.tasks.families.base)."""

from __future__ import annotations

from rl.tasks.families import numbers, parsing, structures, text
from rl.tasks.families.base import LEVELS, Family, Spec, SpecError, build

FAMILIES: dict[str, Family] = {f.name: f for m in (text, numbers, structures, parsing) for f in m.FAMILIES}

__all__ = ["FAMILIES", "LEVELS", "Family", "Spec", "SpecError", "build"]
