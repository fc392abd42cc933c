"""Workspace tasks made by sarl: a small package with its own tests, worked
on with tools (rl.agent.workspace).

Each unit is a module of a small package: a function with a docstring, its
reference body, bugs planted in it, and calls whose expected values come
from running the reference here. Three kinds of task per unit:

  fix          the module holds a bug and its visible tests fail; fix it
  implement    the function is a stub that raises NotImplementedError
  make-pass    a named failing test of tests/; change the code, not the test

The visible tests (tests/test_<module>.py, runnable as
`python3 tests/test_<module>.py` without pytest) hold a few of the calls;
the hidden tests (`check(m)`, m the module) hold all of them. The reference
is the module as it should be, a whole-file patch ({path: content}).
"""

from __future__ import annotations

import json
import random
import textwrap
from dataclasses import dataclass

from rl.tasks.format import Task, TaskLimits
from rl.tasks.repairs import mutants


@dataclass(frozen=True)
class Unit:
    package: str
    module: str
    func: str
    signature: str
    doc: str
    body: str
    """The reference body (indented four spaces)."""
    bugs: tuple[str, ...]
    """Bodies with a planted bug, each failing some visible call."""
    calls: tuple[str, ...]
    """Argument lists, as Python source, e.g. `"'A b'"`, `"[1, 2], 3"`."""
    visible: int = 3
    """The first `visible` calls are in the visible tests."""
    difficulty: int = 1


UNITS = (
    Unit(
        "textkit",
        "slug",
        "slugify",
        "(text)",
        "Lowercase words of letters and digits, joined by '-'; every other character separates words.",
        "    import re\n    return '-'.join(re.findall(r'[a-z0-9]+', text.lower()))\n",
        ("    return text.lower().replace(' ', '-')\n", "    return '-'.join(text.split())\n"),
        (
            "'Hello World'",
            "'  Many   spaces '",
            "'C++ & Rust!'",
            "'already-a-slug'",
            "''",
            "'MiXeD 42 Case'",
            "'tabs\\tand\\nlines'",
            "'---'",
        ),
    ),
    Unit(
        "textkit",
        "shorten",
        "truncate",
        "(text, width)",
        "The text itself if it has at most `width` characters; else its first `width - 3` characters and '...'.",
        "    return text if len(text) <= width else text[: width - 3] + '...'\n",
        (
            "    return text if len(text) < width else text[: width - 3] + '...'\n",
            "    return text if len(text) <= width else text[:width] + '...'\n",
        ),
        ("'hello', 5", "'hello world', 8", "'abcdef', 6", "'', 4", "'abcdefgh', 7", "'xy', 10", "'0123456789', 9"),
    ),
    Unit(
        "numkit",
        "stats",
        "median",
        "(values)",
        "The median of a non-empty list of numbers: the middle value once sorted, or the mean of the two middle ones.",
        "    s = sorted(values)\n    n = len(s)\n    mid = n // 2\n"
        "    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2\n",
        (
            "    n = len(values)\n    mid = n // 2\n"
            "    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2\n",
            "    s = sorted(values)\n    return s[len(s) // 2]\n",
        ),
        ("[3, 1, 2]", "[4, 1, 3, 2]", "[5]", "[10, -2, 7, 7]", "[1.5, 0.5]", "[9, 8, 7, 6, 5]", "[2, 2, 2, 1]"),
    ),
    Unit(
        "numkit",
        "bounds",
        "clamp",
        "(x, low, high)",
        "x limited to the closed range [low, high]; if low > high, the two are swapped first.",
        "    if low > high:\n        low, high = high, low\n    return max(low, min(x, high))\n",
        ("    return min(low, max(x, high))\n", "    return max(low, min(x, high))\n"),
        ("5, 0, 10", "-3, 0, 10", "5, 10, 0", "42, 0, 10", "0, 0, 0", "-1, -5, -2", "7.5, 1, 7"),
        difficulty=1,
    ),
    Unit(
        "listkit",
        "chunks",
        "chunk",
        "(items, size)",
        "The items split into lists of `size` consecutive items; the last list may be shorter.",
        "    return [items[i : i + size] for i in range(0, len(items), size)]\n",
        (
            "    return [items[i : i + size] for i in range(0, len(items) - size + 1, size)]\n",
            "    return [items[i : i + size] for i in range(0, len(items), size + 1)]\n",
        ),
        ("[1, 2, 3, 4, 5], 2", "[1, 2, 3], 3", "[], 4", "['a', 'b', 'c', 'd'], 1", "[1, 2], 5", "list(range(7)), 3"),
    ),
    Unit(
        "listkit",
        "unique",
        "dedupe",
        "(items)",
        "The items without repeats, each kept where it first appears.",
        "    seen = set()\n    out = []\n    for x in items:\n        if x not in seen:\n            seen.add(x)\n"
        "            out.append(x)\n    return out\n",
        ("    return sorted(set(items))\n", "    return list(set(items))\n"),
        ("[3, 1, 3, 2, 1]", "['b', 'a', 'b']", "[]", "[5, 5, 5]", "[2, 1]", "[1, 2, 1, 3, 2, 4]"),
    ),
    Unit(
        "config",
        "kv",
        "parse_kv",
        "(text)",
        "A dict of `key=value` lines: keys and values stripped; blank lines and lines starting with '#' skipped; "
        "a later key replaces an earlier one.",
        "    out = {}\n    for line in text.splitlines():\n        line = line.strip()\n"
        "        if not line or line.startswith('#'):\n            continue\n"
        "        key, _, value = line.partition('=')\n        out[key.strip()] = value.strip()\n    return out\n",
        (
            "    out = {}\n    for line in text.splitlines():\n        if not line.strip():\n            continue\n"
            "        key, _, value = line.partition('=')\n        out[key.strip()] = value.strip()\n    return out\n",
            "    out = {}\n    for line in text.splitlines():\n        line = line.strip()\n"
            "        if not line or line.startswith('#'):\n            continue\n"
            "        key, _, value = line.partition('=')\n        out[key] = value\n    return out\n",
        ),
        ("'a=1\\nb=2'", "'# comment\\nx = 5\\n\\ny=6'", "''", "'k=v\\nk=w'", "'  p =  q  \\n#z=1'", "'url=a=b'"),
        difficulty=2,
    ),
    Unit(
        "datekit",
        "calendar",
        "is_leap",
        "(year)",
        "Whether the year is a leap year of the Gregorian calendar.",
        "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
        ("    return year % 4 == 0\n", "    return year % 4 == 0 and year % 100 != 0\n"),
        ("2024", "1900", "2000", "2023", "2100", "1600", "4"),
    ),
    Unit(
        "textkit",
        "counts",
        "word_freq",
        "(text)",
        "How often each word occurs, case-insensitively: a dict from the lowercased word (letters only) to its count.",
        "    import re\n    out = {}\n    for w in re.findall(r'[a-z]+', text.lower()):\n"
        "        out[w] = out.get(w, 0) + 1\n    return out\n",
        (
            "    import re\n    out = {}\n    for w in re.findall(r'[A-Za-z]+', text):\n"
            "        out[w] = out.get(w, 0) + 1\n    return out\n",
            "    out = {}\n    for w in text.lower().split():\n        out[w] = out.get(w, 0) + 1\n    return out\n",
        ),
        ("'The cat and the hat'", "'a, b. A!'", "''", "'Go go GO'", "'one two  three'", "'x1y2'"),
        difficulty=2,
    ),
    Unit(
        "pathkit",
        "names",
        "split_ext",
        "(name)",
        "(stem, extension) of a file name: the extension is after the last '.', without it; a name that starts "
        "with '.' and has no other '.' has no extension; no '.' means an empty extension.",
        "    dot = name.rfind('.')\n    if dot <= 0:\n        return (name, '')\n"
        "    return (name[:dot], name[dot + 1 :])\n",
        (
            "    dot = name.rfind('.')\n    if dot < 0:\n        return (name, '')\n"
            "    return (name[:dot], name[dot + 1 :])\n",
            "    dot = name.find('.')\n    if dot <= 0:\n        return (name, '')\n"
            "    return (name[:dot], name[dot + 1 :])\n",
        ),
        ("'report.pdf'", "'.bashrc'", "'archive.tar.gz'", "'README'", "'a.'", "'x.y.z'"),
        difficulty=2,
    ),
    Unit(
        "money",
        "fmt",
        "format_cents",
        "(cents)",
        "An amount of cents as dollars: 12345 -> '$123.45', 5 -> '$0.05', -105 -> '-$1.05'.",
        "    sign = '-' if cents < 0 else ''\n    cents = abs(cents)\n"
        "    return f'{sign}${cents // 100}.{cents % 100:02d}'\n",
        (
            "    sign = '-' if cents < 0 else ''\n    cents = abs(cents)\n"
            "    return f'{sign}${cents // 100}.{cents % 100}'\n",
            "    return f'${cents // 100}.{cents % 100:02d}'\n",
        ),
        ("12345", "5", "-105", "0", "100", "-7", "99999"),
        difficulty=2,
    ),
    Unit(
        "inventory",
        "stock",
        "restock",
        "(levels, threshold, amount)",
        "A new dict of stock levels: each item strictly below `threshold` gets `amount` more.",
        "    return {k: v + amount if v < threshold else v for k, v in levels.items()}\n",
        (
            "    return {k: v + amount if v <= threshold else v for k, v in levels.items()}\n",
            "    return {k: threshold + amount if v < threshold else v for k, v in levels.items()}\n",
        ),
        ("{'a': 1, 'b': 5}, 5, 10", "{'x': 0}, 1, 3", "{}, 2, 2", "{'p': 3, 'q': 2}, 3, 1", "{'z': 9}, 2, 4"),
        difficulty=2,
    ),
    Unit(
        "grid",
        "moves",
        "neighbors",
        "(row, col, rows, cols)",
        "The cells up, down, left and right of (row, col) inside a rows x cols grid, as a sorted list of tuples.",
        "    out = [(row + dr, col + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))]\n"
        "    return sorted((r, c) for r, c in out if 0 <= r < rows and 0 <= c < cols)\n",
        (
            "    out = [(row + dr, col + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))]\n"
            "    return sorted((r, c) for r, c in out if 0 <= r <= rows and 0 <= c <= cols)\n",
            "    out = [(row + dr, col + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))]\n"
            "    return [(r, c) for r, c in out if 0 <= r < rows and 0 <= c < cols]\n",
        ),
        ("0, 0, 3, 3", "1, 1, 3, 3", "2, 2, 3, 3", "0, 0, 1, 1", "0, 4, 1, 5", "3, 0, 4, 2"),
        difficulty=3,
    ),
    Unit(
        "roman",
        "numerals",
        "to_roman",
        "(n)",
        "The Roman numeral of 1 <= n <= 3999, with subtractive pairs (4 is 'IV', 90 is 'XC').",
        "    out = ''\n"
        "    for value, sym in ((1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
        "                       (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')):\n"
        "        while n >= value:\n            out += sym\n            n -= value\n    return out\n",
        (
            "    out = ''\n"
            "    for value, sym in ((1000, 'M'), (500, 'D'), (100, 'C'), (50, 'L'), (10, 'X'), (5, 'V'),\n"
            "                       (1, 'I')):\n        while n >= value:\n            out += sym\n"
            "            n -= value\n"
            "    return out\n",
            "    out = ''\n"
            "    for value, sym in ((1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
            "                       (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')):\n"
            "        if n >= value:\n            out += sym\n            n -= value\n    return out\n",
        ),
        ("4", "1994", "3", "58", "9", "3999", "40"),
        difficulty=3,
    ),
)

KINDS = ("fix", "implement", "make-pass")


def _source(u: Unit, body: str) -> str:
    return f'def {u.func}{u.signature}:\n    """{u.doc}"""\n{body}'


def _expected(u: Unit) -> list[str]:
    ns: dict = {}
    exec(_source(u, u.body), ns)  # noqa: S102 (the project's own reference code)
    return [repr(eval(f"{u.func}({args})", ns)) for args in u.calls]  # noqa: S307


def _visible_tests(u: Unit, expected: list[str]) -> str:
    cases = "".join(
        f"\n\ndef test_{u.func}_{i + 1}():\n    got, want = {u.func}({args}), {want}\n"
        '    assert got == want, f"returned {got!r}, expected {want!r}"\n'
        for i, (args, want) in enumerate(zip(u.calls[: u.visible], expected, strict=False))
    )
    return (
        "import os\nimport sys\n\nsys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"
        f"from {u.package}.{u.module} import {u.func}  # noqa: E402\n"
        f"{cases}\n\n"
        'if __name__ == "__main__":  # python3 tests/test_x.py: runs every test, no pytest needed\n'
        "    failed = 0\n"
        "    for name, fn in sorted(globals().items()):\n"
        '        if name.startswith("test_") and callable(fn):\n'
        "            try:\n"
        "                fn()\n"
        '                print("PASS", name)\n'
        "            except Exception as e:\n"
        "                failed += 1\n"
        '                print("FAIL", name, f"{type(e).__name__}: {e}")\n'
        "    sys.exit(1 if failed else 0)\n"
    )


def _hidden_tests(u: Unit, expected: list[str]) -> str:
    lines = "".join(f"    assert m.{u.func}({args}) == {want}\n" for args, want in zip(u.calls, expected, strict=True))
    return f"def check(m):\n{lines}"


def failing_visible(u: Unit, body: str) -> int:
    """The first visible call the planted body gets wrong; ValueError if it
    gets every one right."""
    expected = _expected(u)
    ns: dict = {}
    exec(_source(u, body), ns)  # noqa: S102 (the project's own planted bug)
    for i, (args, want) in enumerate(zip(u.calls[: u.visible], expected, strict=False)):
        try:
            if repr(eval(f"{u.func}({args})", ns)) != want:  # noqa: S307
                return i
        except Exception:  # noqa: BLE001
            return i
    raise ValueError(f"{u.package}.{u.module}: a planted bug passes every visible test")


def wrong_version(u: Unit, given: str) -> str | None:
    """A body that is neither `given` nor the reference and fails a visible
    test: the unit's other planted bug, else one small mutation of the
    reference (rl.tasks.repairs, in an order seeded by the unit's name);
    None where there is none. A repair trace's first, wrong, edit."""
    reference = textwrap.dedent(u.body)
    mutated = (
        textwrap.indent(code + "\n", "    ")
        for code in mutants(reference, u.func, random.Random(f"{u.package}.{u.module}"))
    )
    for body in (*u.bugs, *mutated):
        if body in (given, u.body):
            continue
        try:
            failing_visible(u, body)
        except Exception:  # noqa: BLE001 (passes every visible test, or does not run: not a wrong version)
            continue
        return body
    return None


def build_tasks(u: Unit, source: str = "sarl-workspace", template_key: str = "", task_key: str = "") -> list[Task]:
    """The unit's tasks: implement, and fix and make-pass where it has a bug.
    `template_key` and `task_key` default to `workspace/PACKAGE.MODULE`."""
    expected = _expected(u)
    path = f"{u.package}/{u.module}.py"
    test_path = f"tests/test_{u.module}.py"
    out = []
    for kind in KINDS if u.bugs else ("implement",):
        if kind == "implement":
            body = "    raise NotImplementedError\n"
            prompt = f"Implement `{u.func}` in `{path}` as its docstring says. The tests are in `{test_path}`."
        elif kind == "fix":
            body = u.bugs[0]
            failing_visible(u, body)
            prompt = (
                f"`{u.func}` in `{path}` has a bug: some of the tests in `{test_path}` fail. "
                "Find it and fix the code so that the function does what its docstring says."
            )
        else:
            body = u.bugs[-1]
            failing = failing_visible(u, body)
            prompt = (
                f"The test `test_{u.func}_{failing + 1}` in `{test_path}` fails. "
                f"Change `{path}` (not the test) so that it passes, keeping the docstring's behaviour."
            )
        files = {
            f"{u.package}/__init__.py": "",
            path: _source(u, body),
            test_path: _visible_tests(u, expected),
            "README.md": f"# {u.package}\n\nRun the tests: `python3 {test_path}`\n",
        }
        out.append(
            Task(
                task_id=f"workspace/{task_key or f'{u.package}.{u.module}'}/{kind}",
                prompt=prompt,
                entry_point=f"{u.package}.{u.module}",
                tests=_hidden_tests(u, expected),
                test_format="workspace",
                environment="workspace",
                reference=json.dumps({path: _source(u, u.body)}),
                files=files,
                limits=TaskLimits(wall_s=10.0, call_s=3.0),
                metadata={
                    "source": source,
                    "family": f"workspace-{kind}",
                    "template": template_key or f"workspace/{u.package}.{u.module}",
                    "function": u.func,
                    "difficulty": min(3, u.difficulty + (kind == "implement")),
                    # a wrong first edit, for a repair trace (rl.tasks.traces)
                    **({"first_attempt": _source(u, wrong)} if (wrong := wrong_version(u, body)) else {}),
                },
            )
        )
    return out


def workspace_tasks() -> list[Task]:
    """Every hand-written unit in every kind: 3 x len(UNITS) tasks."""
    return [t for u in UNITS for t in build_tasks(u)]
