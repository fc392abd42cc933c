"""Families on lists and grids: filtering, transforming, 2-D grids."""

from __future__ import annotations

from typing import Any

from rl.tasks.families.base import Family, Spec, ints


def filtering(rng: Any, level: int) -> Spec:
    if level == 1:
        k = rng.randint(-5, 20)
        return Spec(
            "keep_greater", "xs: list[int]", "list[int]",
            f"Return the elements of xs greater than {k}, in their order.",
            f"return [x for x in xs if x > {k}]",
            [(ints(rng, rng.randint(0, 8)),) for _ in range(8)],
        )  # fmt: skip
    if level == 2:
        k = rng.randint(2, 5)
        return Spec(
            "squares_of_multiples", "xs: list[int]", "list[int]",
            f"Return the squares of the elements of xs that are divisible by {k}, in their order.",
            f"return [x * x for x in xs if x % {k} == 0]",
            [(ints(rng, rng.randint(1, 9)),) for _ in range(8)],
        )  # fmt: skip
    parity = rng.choice(["even", "odd"])
    return Spec(
        "by_digit_sum", "xs: list[int]", "list[int]",
        f"Keep the elements of xs whose sum of decimal digits (of the absolute value) is {parity}, and return "
        "them sorted from largest to smallest.",
        f"return sorted((x for x in xs if sum(map(int, str(abs(x)))) % 2 == {0 if parity == 'even' else 1}), "
        "reverse=True)",
        [(ints(rng, rng.randint(2, 9), -99, 999),) for _ in range(8)],
    )  # fmt: skip


def transforming(rng: Any, level: int) -> Spec:
    if level == 1:
        k = rng.randint(1, 4)
        return Spec(
            "rotate_left", "xs: list[int]", "list[int]",
            f"Return xs rotated left by {k} places (the first element moves to the end, {k} times). An empty "
            "list stays empty.",
            f"if not xs:\n    return []\nk = {k} % len(xs)\nreturn xs[k:] + xs[:k]",
            [(ints(rng, rng.randint(0, 7)),) for _ in range(8)],
        )  # fmt: skip
    if level == 2:
        k = rng.randint(2, 4)
        return Spec(
            "chunks", "xs: list[int]", "list[list[int]]",
            f"Split xs into consecutive chunks of {k} elements; the last chunk may be shorter.",
            f"return [xs[i:i + {k}] for i in range(0, len(xs), {k})]",
            [(ints(rng, rng.randint(0, 10)),) for _ in range(8)],
        )  # fmt: skip
    w = rng.randint(2, 4)
    return Spec(
        "window_max", "xs: list[int]", "list[int]",
        f"Return the largest element of each window of {w} consecutive elements of xs, from left to right; "
        f"a list shorter than {w} gives [].",
        f"return [max(xs[i:i + {w}]) for i in range(len(xs) - {w} + 1)]",
        [(ints(rng, rng.randint(1, 10)),) for _ in range(8)],
    )  # fmt: skip


def grids(rng: Any, level: int) -> Spec:
    def grid() -> list[list[int]]:
        rows, cols = rng.randint(1, 4), rng.randint(1, 4)
        return [ints(rng, cols, 0, 9) for _ in range(rows)]

    if level == 1:
        return Spec(
            "transpose", "g: list[list[int]]", "list[list[int]]",
            "Return the transpose of the rectangular grid g (a list of rows of equal length): row i of the "
            "result is column i of g.",
            "return [list(col) for col in zip(*g)]",
            [(grid(),) for _ in range(8)],
        )  # fmt: skip
    if level == 2:
        which = rng.choice(["row", "column"])
        body = "return [sum(r) for r in g]" if which == "row" else "return [sum(c) for c in zip(*g)]"
        return Spec(
            f"{which}_sums", "g: list[list[int]]", "list[int]",
            f"Return the sum of each {which} of the rectangular grid g (a list of rows of equal length), "
            f"{'top to bottom' if which == 'row' else 'left to right'}.",
            body,
            [(grid(),) for _ in range(8)],
        )  # fmt: skip
    k = rng.randint(1, 3)
    return Spec(
        "rotate_grid", "g: list[list[int]]", "list[list[int]]",
        f"Return the rectangular grid g rotated 90 degrees clockwise {k} time(s).",
        f"for _ in range({k}):\n    g = [list(row) for row in zip(*g[::-1])]\nreturn g",
        [(grid(),) for _ in range(8)],
    )  # fmt: skip


FAMILIES = [
    Family("filtering", "selecting list elements by a rule", filtering),
    Family("transforming", "rotations, chunks and sliding windows", transforming),
    Family("grids", "transposes, sums and rotations of 2-D grids", grids),
]
