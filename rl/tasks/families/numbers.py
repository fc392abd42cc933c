"""Families on integers: arithmetic, sequences, number formatting."""

from __future__ import annotations

from typing import Any

from rl.tasks.families.base import Family, Spec


def arithmetic(rng: Any, level: int) -> Spec:
    if level == 1:
        a, b = rng.sample([2, 3, 5, 7, 11], 2)
        return Spec(
            "sum_of_multiples", "n: int", "int",
            f"Return the sum of the positive integers below n that are multiples of {a} or of {b} (each "
            "counted once). For n <= 1 return 0.",
            f"return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)",
            [(rng.randint(0, 60),) for _ in range(8)],
        )  # fmt: skip
    if level == 2:
        base = rng.randint(3, 9)
        return Spec(
            "digit_sum_in_base", "n: int", "int",
            f"Return the sum of the digits of the non-negative integer n written in base {base}.",
            f"total = 0\nwhile n:\n    n, d = divmod(n, {base})\n    total += d\nreturn total",
            [(rng.randint(0, 2000),) for _ in range(8)],
        )  # fmt: skip
    m = rng.randint(3, 6)
    r = rng.randint(1, m - 1)
    return Spec(
        "count_primes_mod", "n: int", "int",
        f"Return how many primes p <= n satisfy p % {m} == {r}.",
        "def is_prime(p):\n    return p > 1 and all(p % q for q in range(2, int(p ** 0.5) + 1))\n"
        f"return sum(1 for p in range(2, n + 1) if is_prime(p) and p % {m} == {r})",
        [(rng.randint(0, 300),) for _ in range(8)],
    )  # fmt: skip


def sequences(rng: Any, level: int) -> Spec:
    if level == 1:
        a, d = rng.randint(-5, 9), rng.randint(2, 7)
        return Spec(
            "arithmetic_terms", "n: int", "list[int]",
            f"Return the first n terms of the arithmetic sequence that starts at {a} and adds {d} each step.",
            f"return [{a} + {d} * i for i in range(n)]",
            [(rng.randint(0, 9),) for _ in range(8)],
        )  # fmt: skip
    if level == 2:
        a, b, m = rng.randint(0, 4), rng.randint(1, 5), rng.choice([7, 10, 13, 100])
        return Spec(
            "fib_mod", "n: int", "int",
            f"A sequence starts f(0) = {a}, f(1) = {b}, and f(i) = (f(i-1) + f(i-2)) % {m} after. Return f(n) "
            "for n >= 0.",
            f"x, y = {a}, {b}\nfor _ in range(n):\n    x, y = y, (x + y) % {m}\nreturn x",
            [(rng.randint(0, 40),) for _ in range(8)],
        )  # fmt: skip
    return Spec(
        "collatz_peak", "n: int", "tuple[int, int]",
        "Starting from n >= 1, repeat: halve n if it is even, else replace it with 3n + 1, until n is 1. "
        "Return (the number of steps, the largest value reached, n itself included).",
        "steps, peak = 0, n\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\n"
        "    peak = max(peak, n)\nreturn (steps, peak)",
        [(rng.randint(1, 60),) for _ in range(8)],
    )  # fmt: skip


def formatting(rng: Any, level: int) -> Spec:
    if level == 1:
        w = rng.randint(4, 10)
        return Spec(
            "binary_padded", "n: int", "str",
            f"Return the non-negative integer n in binary, without a prefix, left-padded with zeros to at "
            f"least {w} digits.",
            f"return bin(n)[2:].zfill({w})",
            [(rng.randint(0, 3000),) for _ in range(8)],
        )  # fmt: skip
    if level == 2:
        sep = rng.choice([",", ".", "_", "'"])
        return Spec(
            "group_thousands", "n: int", "str",
            f"Return the integer n in decimal with {sep!r} between groups of three digits, counted from the "
            "right, and a leading '-' when n is negative.",
            f"sign, digits = ('-' if n < 0 else ''), str(abs(n))\ngroups = []\nwhile digits:\n"
            f"    groups.append(digits[-3:])\n    digits = digits[:-3]\nreturn sign + {sep!r}.join(reversed(groups))",
            [(rng.randint(-10**7, 10**8),) for _ in range(8)],
        )  # fmt: skip
    return Spec(
        "to_roman", "n: int", "str",
        "Return 1 <= n <= 3999 in Roman numerals (I, V, X, L, C, D, M with the subtractive forms IV, IX, "
        "XL, XC, CD, CM), uppercase.",
        "out = ''\nfor value, sym in ((1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
        "                   (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')):\n"
        "    while n >= value:\n        out += sym\n        n -= value\nreturn out",
        [(rng.randint(1, 3999),) for _ in range(8)],
    )  # fmt: skip


FAMILIES = [
    Family("arithmetic", "sums, digits in a base, primes", arithmetic),
    Family("sequences", "arithmetic, Fibonacci-like and Collatz sequences", sequences),
    Family("formatting", "binary, digit grouping, Roman numerals", formatting),
]
