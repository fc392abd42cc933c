"""Families on strings: letter case, counting, ciphers, words."""

from __future__ import annotations

import string
from typing import Any

from rl.tasks.families.base import Family, Spec, words

LETTERS = string.ascii_letters


def _texts(rng: Any, n: int, alphabet: str = LETTERS + "  ,.!", lo: int = 0, hi: int = 14) -> list[str]:
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def case(rng: Any, level: int) -> Spec:
    if level == 1:
        start = rng.choice(["upper", "lower"])
        other = "lower" if start == "upper" else "upper"
        return Spec(
            "alternate_case", "s: str", "str",
            f"Return s with its characters alternating in case by position: index 0 {start}case, index 1 "
            f"{other}case, index 2 {start}case, and so on (every character counts for the position).",
            f"return ''.join(c.{start}() if i % 2 == 0 else c.{other}() for i, c in enumerate(s))",
            [(t,) for t in _texts(rng, 8, lo=2)],
        )  # fmt: skip
    if level == 2:
        sep = rng.choice([" ", "-", "_"])
        return Spec(
            "title_words", "s: str", "str",
            f"Split s on {sep!r}, make the first letter of each part uppercase and the rest lowercase, and "
            f"join the parts with {sep!r} again (empty parts stay empty).",
            f"return {sep!r}.join(w[:1].upper() + w[1:].lower() for w in s.split({sep!r}))",
            [(sep.join(words(rng, rng.randint(1, 4), LETTERS)),) for _ in range(8)],
        )  # fmt: skip
    k = rng.randint(2, 4)
    return Spec(
        "shout_every_kth_letter", "s: str", "str",
        f"Return s with every {k}th letter uppercased and the other letters lowercased. Only letters count "
        f"for the position: the 1st letter is position 1; other characters are kept as they are.",
        f"out, n = [], 0\nfor c in s:\n    if c.isalpha():\n        n += 1\n        c = c.upper() if n % {k} == 0 "
        "else c.lower()\n    out.append(c)\nreturn ''.join(out)",
        [(t,) for t in _texts(rng, 8, lo=4)],
    )  # fmt: skip


def counting(rng: Any, level: int) -> Spec:
    if level == 1:
        chars = "".join(rng.sample("abcdefghij", rng.randint(2, 3)))
        return Spec(
            "count_chars", "s: str", "int",
            f"Return how many characters of s are one of {chars!r}, ignoring case.",
            f"return sum(c in {chars!r} for c in s.lower())",
            [(t,) for t in _texts(rng, 8, alphabet="abcdefghijABCDEFGHIJ xyz")],
        )  # fmt: skip
    if level == 2:
        return Spec(
            "longest_run", "s: str", "tuple[str, int]",
            "Return the character of the longest run of one repeated character in s, and the run's length. "
            "On a tie the run that comes first wins; for an empty string return ('', 0).",
            "best, cur, prev = ('', 0), 0, None\nfor c in s:\n    cur = cur + 1 if c == prev else 1\n    prev = c\n"
            "    if cur > best[1]:\n        best = (c, cur)\nreturn best",
            [(t,) for t in _texts(rng, 8, alphabet=rng.choice(["ab", "abc", "xyz"]), lo=0, hi=12)],
        )  # fmt: skip
    k = rng.randint(2, 3)
    return Spec(
        "chars_seen_at_least", "s: str", "str",
        f"Return the distinct characters that occur at least {k} times in s, in the order of their first "
        "occurrence, as one string. Case matters.",
        "seen = {}\nfor c in s:\n    seen[c] = seen.get(c, 0) + 1\n"
        f"return ''.join(c for c in seen if seen[c] >= {k})",
        [(t,) for t in _texts(rng, 8, alphabet="abcdeAB", lo=3, hi=14)],
    )  # fmt: skip


def ciphers(rng: Any, level: int) -> Spec:
    if level == 1:
        k = rng.randint(1, 25)
        return Spec(
            "caesar", "s: str", "str",
            f"Shift every letter of s {k} places forward in the alphabet, wrapping from z to a and keeping "
            "its case; other characters are unchanged.",
            f"out = []\nfor c in s:\n    if c.isascii() and c.isalpha():\n        base = ord('a') if c.islower() "
            f"else ord('A')\n        c = chr((ord(c) - base + {k}) % 26 + base)\n    out.append(c)\n"
            "return ''.join(out)",
            [(t,) for t in _texts(rng, 8, lo=1)],
        )  # fmt: skip
    if level == 2:
        return Spec(
            "run_length_encode", "s: str", "str",
            "Encode s by runs: each maximal run of one character becomes the character followed by the run's "
            "length, e.g. 'aaab' -> 'a3b1'. The empty string encodes to ''.",
            "out, i = [], 0\nwhile i < len(s):\n    j = i\n    while j < len(s) and s[j] == s[i]:\n        j += 1\n"
            "    out.append(s[i] + str(j - i))\n    i = j\nreturn ''.join(out)",
            [(t,) for t in _texts(rng, 8, alphabet=rng.choice(["ab", "abc", "xy."]), lo=0, hi=12)],
        )  # fmt: skip
    key = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 4)))
    return Spec(
        "vigenere", "s: str", "str",
        f"Encrypt s with the Vigenere key {key!r}: the n-th letter of s (counting letters only, from 0) is "
        f"shifted forward by the position in the alphabet (a = 0) of key[n % {len(key)}], wrapping and keeping "
        "its case. Other characters are unchanged and do not use up a key letter.",
        f"out, n = [], 0\nfor c in s:\n    if c.isascii() and c.isalpha():\n        base = ord('a') if c.islower() "
        f"else ord('A')\n        shift = ord({key!r}[n % {len(key)}]) - ord('a')\n        c = chr((ord(c) - base + "
        "shift) % 26 + base)\n        n += 1\n    out.append(c)\nreturn ''.join(out)",
        [(t,) for t in _texts(rng, 8, lo=1)],
    )  # fmt: skip


def wordplay(rng: Any, level: int) -> Spec:
    alphabet = "abcde"
    if level == 1:
        return Spec(
            "word_lengths", "s: str", "list[int]",
            "Return the length of each word of s, in order; words are separated by runs of spaces.",
            "return [len(w) for w in s.split()]",
            [(" ".join(words(rng, rng.randint(0, 5))),) for _ in range(8)],
        )  # fmt: skip
    if level == 2:
        return Spec(
            "most_common_word", "s: str", "str",
            "Return the most frequent word of s, lowercased (words are separated by spaces; case is "
            "ignored). On a tie return the alphabetically smallest. Return '' when s has no word.",
            "counts = {}\nfor w in s.lower().split():\n    counts[w] = counts.get(w, 0) + 1\n"
            "return min(counts, key=lambda w: (-counts[w], w)) if counts else ''",
            [(" ".join(rng.choice(["ab", "Ab", "ba", "cd", "dc", "a"]) for _ in range(rng.randint(0, 7))),)
             for _ in range(8)],
        )  # fmt: skip
    return Spec(
        "anagram_groups", "ws: list[str]", "list[list[str]]",
        "Group the words of ws that are anagrams of each other (the same letters, counted). Return only the "
        "groups of two or more words, each sorted, the groups sorted by their first word. A word that "
        "appears twice counts twice.",
        "groups = {}\nfor w in ws:\n    groups.setdefault(''.join(sorted(w)), []).append(w)\n"
        "return sorted(sorted(g) for g in groups.values() if len(g) > 1)",
        [(words(rng, rng.randint(3, 8), alphabet, 2, 3),) for _ in range(8)],
    )  # fmt: skip


FAMILIES = [
    Family("case", "letter case by position and by word", case),
    Family("counting", "counting characters and runs", counting),
    Family("ciphers", "Caesar, run-length and Vigenere encodings", ciphers),
    Family("words", "splitting into words, frequencies, anagrams", wordplay),
]
