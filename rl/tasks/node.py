"""JavaScript tasks made by sarl: one function each, run by Node.js.

The functions are those of the workspace units (rl.tasks.workspaces), in
JavaScript: the same docstrings and calls, a reference written for Node, and
expected values computed by the Python reference (so that a reference that
disagrees with its twin fails validation). The hidden tests are data: the
argument lists and the expected JSON values, graded outside the node
process (rl/verify/node_runner.py). Run `sarl tasks generate --family node`.
"""

from __future__ import annotations

import json
import re

from rl.tasks.format import Example, Task, TaskLimits
from rl.tasks.workspaces import UNITS, Unit

JS = {
    "slugify": "return (text.toLowerCase().match(/[a-z0-9]+/g) || []).join('-');",
    "truncate": "return text.length <= width ? text : text.slice(0, width - 3) + '...';",
    "median": "const s = [...values].sort((a, b) => a - b);\n  const n = s.length, m = Math.floor(n / 2);\n"
    "  return n % 2 ? s[m] : (s[m - 1] + s[m]) / 2;",
    "clamp": "if (low > high) [low, high] = [high, low];\n  return Math.max(low, Math.min(x, high));",
    "chunk": "const out = [];\n  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));\n"
    "  return out;",
    "dedupe": "return [...new Set(items)];",
    "parseKv": "const out = {};\n  for (let line of text.split('\\n')) {\n    line = line.trim();\n"
    "    if (!line || line.startsWith('#')) continue;\n    const i = line.indexOf('=');\n"
    "    const key = i < 0 ? line : line.slice(0, i), value = i < 0 ? '' : line.slice(i + 1);\n"
    "    out[key.trim()] = value.trim();\n  }\n  return out;",
    "isLeap": "return year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);",
    "wordFreq": "const out = {};\n  for (const w of text.toLowerCase().match(/[a-z]+/g) || [])\n"
    "    out[w] = (out[w] || 0) + 1;\n  return out;",
    "splitExt": "const dot = name.lastIndexOf('.');\n"
    "  return dot <= 0 ? [name, ''] : [name.slice(0, dot), name.slice(dot + 1)];",
    "formatCents": "const sign = cents < 0 ? '-' : '';\n  const c = Math.abs(cents);\n"
    "  return `${sign}$${Math.floor(c / 100)}.${String(c % 100).padStart(2, '0')}`;",
    "restock": "const out = {};\n  for (const [k, v] of Object.entries(levels))\n"
    "    out[k] = v < threshold ? v + amount : v;\n  return out;",
    "neighbors": "return [[row - 1, col], [row + 1, col], [row, col - 1], [row, col + 1]]\n"
    "    .filter(([r, c]) => r >= 0 && r < rows && c >= 0 && c < cols)\n"
    "    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);",
    "toRoman": "let out = '';\n  const table = [[1000, 'M'], [900, 'CM'], [500, 'D'], [400, 'CD'], [100, 'C'],\n"
    "    [90, 'XC'], [50, 'L'], [40, 'XL'], [10, 'X'], [9, 'IX'], [5, 'V'], [4, 'IV'], [1, 'I']];\n"
    "  for (const [value, sym] of table) while (n >= value) { out += sym; n -= value; }\n  return out;",
}
TRIVIAL_JS = (
    "",
    "return null;",
    "return 0;",
    "return '';",
    "return [];",
    "return {};",
    "return true;",
    "return false;",
)
"""Bodies that know nothing of the task: none may pass."""


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _args(u: Unit) -> list[list[object]]:
    return [json.loads(json.dumps(eval(f"[{a}]"))) for a in u.calls]  # noqa: S307 (the project's own data)


def _expected(u: Unit) -> list[object]:
    ns: dict = {}
    exec(f"def {u.func}{u.signature}:\n{u.body}", ns)  # noqa: S102 (the project's own reference)
    return [json.loads(json.dumps(eval(f"{u.func}({a})", ns))) for a in u.calls]  # noqa: S307


def function(name: str, params: str, body: str) -> str:
    return f"function {name}{params} {{\n  {body}\n}}\n"


def stub(task: Task, body: str) -> str:
    """A function of the task's name and parameters with `body`."""
    m = re.search(r"function (\w+)(\([^)]*\))", task.prompt)
    assert m is not None
    return function(m.group(1), m.group(2), body)


def node_tasks() -> list[Task]:
    out = []
    for u in UNITS:
        name = camel(u.func)
        args, expected = _args(u), _expected(u)
        shown = [
            f" *   {name}({', '.join(json.dumps(a) for a in call)}) // {json.dumps(want)}"
            for call, want in zip(args[: u.visible], expected, strict=False)
        ]
        prompt = (
            "/**\n * "
            + u.doc
            + "\n * Examples:\n"
            + "\n".join(shown)
            + "\n */\nfunction "
            + name
            + u.signature
            + " {\n"
        )
        out.append(
            Task(
                task_id=f"node/{name}",
                prompt=prompt,
                entry_point=name,
                tests=json.dumps({"calls": args, "expected": expected, "visible": u.visible}),
                test_format="node",
                environment="node",
                runtime="node",
                reference=function(name, u.signature, JS[name]),
                examples=[
                    Example(call=f"{name}({', '.join(json.dumps(a) for a in c)})", expected=json.dumps(w))
                    for c, w in zip(args[: u.visible], expected, strict=False)
                ],
                limits=TaskLimits(wall_s=10.0, call_s=2.0),
                metadata={
                    "source": "sarl-node",
                    "family": "node",
                    "template": f"node/{name}",
                    "difficulty": u.difficulty,
                },
            )
        )
    return out
