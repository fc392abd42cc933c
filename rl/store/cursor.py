"""The learner's record of the batches it consumed: saved in each of its
checkpoints, so that a batch is trained once across restarts."""

from __future__ import annotations

from typing import Any

from rl.store.zgroup import CorruptData, StoreError


class Cursor:
    """The set of consumed batch keys, kept per writer as sorted closed ranges."""

    def __init__(self, ranges: dict[str, list[list[int]]] | None = None):
        self.ranges: dict[str, list[list[int]]] = {w: [list(r) for r in rs] for w, rs in (ranges or {}).items()}

    def __contains__(self, key: tuple[str, int]) -> bool:
        writer, seq = key
        return any(a <= seq <= b for a, b in self.ranges.get(writer, ()))

    def add(self, key: tuple[str, int]) -> None:
        writer, seq = key
        if key in self:
            raise StoreError(f"batch {writer}/{seq} consumed twice")
        rs = self.ranges.setdefault(writer, [])
        rs.append([seq, seq])
        rs.sort()
        merged = [rs[0]]
        for a, b in rs[1:]:
            if a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.ranges[writer] = merged

    def __len__(self) -> int:
        return sum(b - a + 1 for rs in self.ranges.values() for a, b in rs)

    def to_json(self) -> dict[str, Any]:
        return {"ranges": self.ranges}

    @classmethod
    def from_json(cls, data: Any) -> Cursor:
        """The cursor saved by `to_json`; CorruptData when `data` is not one."""
        ranges = data.get("ranges") if isinstance(data, dict) else None
        ok = isinstance(ranges, dict) and all(
            isinstance(w, str)
            and isinstance(rs, list)
            and all(isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) for r in rs)
            for w, rs in ranges.items()
        )
        if not ok:
            raise CorruptData(f"not a cursor: {str(data)[:100]}")
        return cls(ranges)
