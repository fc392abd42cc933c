"""What a held-out task shares with the tasks a run trains on.

A held-out score means something only if the model never saw the held-out
tasks in any form. Three ways a task leaks, each checked for every pair of
a held-out and a training task:

- **template**: the prompt before its examples is the same once numbers,
  quoted strings and the function's name are masked (a task generated from
  the same template with other constants; stricter than masking constants
  alone, since a template may draw its function's name);
- **reference**: the reference solutions are the same program: equal ASTs
  once docstrings, layout and the function's name are normalised away (a
  workspace's: the body of its function in the module its patch writes);
- **near-duplicate**: the descriptions' MinHash signatures (word 3-shingles,
  rl.tasks.dedup) agree on at least `threshold` of their values (estimated
  Jaccard), which catches reworded and lightly edited prompts.

Not covered: two different programs that behave alike on every input
(behavioural duplicates), and knowledge shared through a family's idea
rather than its text; a family-disjoint split (`--by family`) is the
stronger guard against the second.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import dataclass, field

import numpy as np

from rl.tasks.dedup import minhash, words
from rl.tasks.format import Task

_EXAMPLES = re.compile(r">>>|\bfor example\b|\bexamples?\s*:|\be\.g\.", re.IGNORECASE)
_STRING = re.compile(r"'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"", re.DOTALL)
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _docstring_open(prompt: str) -> str:
    """The prompt with its docstring's delimiters taken out, so that the
    string masking below masks quoted constants, not the whole docstring."""
    return prompt.replace('"""', "\n").replace("'''", "\n")


def workspace_function(task: Task) -> str | None:
    """A workspace task's function as its module shows it, from `def` to the
    end of its docstring: what the task asks for, whatever the kind (fix,
    implement, make-pass) says around it. None where the task names no
    function (metadata `function`) or its module does not show it."""
    name = task.metadata.get("function")
    source = task.files.get(task.entry_point.replace(".", "/") + ".py")
    if task.test_format != "workspace" or not name or source is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None or ast.get_docstring(fn) is None:
        return None
    return "\n".join(source.splitlines()[fn.lineno - 1 : fn.body[0].end_lineno])


def _function_name(task: Task) -> str:
    """The name the template masks: a workspace's function, else the entry point."""
    return str(task.metadata["function"]) if workspace_function(task) is not None else task.entry_point


def description(task: Task) -> str:
    """The prompt before its examples (what the task asks for); a workspace
    task's, its function's docstring before its examples."""
    text = _docstring_open(workspace_function(task) or task.prompt)
    cut = _EXAMPLES.search(text)
    return text[: cut.start()] if cut else text


def template(task: Task) -> str:
    """The task's template key: its description, with the function's name,
    quoted strings and numbers masked, layout collapsed. A text task's is its
    instruction: the text it is given is the instance."""
    text = description(task)
    if task.test_format == "text":
        text = text.split("Text:", 1)[0]
    name = _function_name(task)
    if name:
        text = re.sub(rf"\b{re.escape(name)}\b", "<F>", text)
    text = _STRING.sub("<S>", text)
    text = _NUMBER.sub("<N>", text)
    return re.sub(r"\s+", " ", text).strip().lower()


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body:
            first = body[0]
            doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if doc and isinstance(first.value.value, str):  # type: ignore[attr-defined]
                node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]


def _reference_sources(task: Task) -> tuple[list[str], str]:
    """Where a reference's program may be, and the name of its function.
    A workspace's reference is a whole-file patch ({path: content}): its
    program is the entry module's content, its function the one the task
    names (metadata `function`). Any other reference is either a whole module
    or, as in HumanEval, the body that follows the prompt."""
    if task.test_format == "workspace" and task.metadata.get("function"):
        try:
            patch = json.loads(task.reference)
        except ValueError:
            return [], ""
        source = patch.get(task.entry_point.replace(".", "/") + ".py") if isinstance(patch, dict) else None
        return ([source] if isinstance(source, str) else []), str(task.metadata["function"])
    return [textwrap.dedent(task.reference), task.prompt + task.reference], task.entry_point


def reference_program(task: Task) -> str | None:
    """The reference as a normalised AST dump; None when there is none or it
    does not parse. Where the source holds the task's function, its body
    alone is taken: the same program under another name, docstring or set of
    docstring examples (another instance's) is the same program."""
    if not task.reference.strip():
        return None
    sources, name = _reference_sources(task)
    tree: ast.AST | None = None
    for source in sources:
        try:
            tree = ast.parse(source)
            break
        except SyntaxError:
            continue
    if tree is None:
        return None
    if isinstance(tree, ast.Module) and len(tree.body) > 0:  # the task's function: its body alone
        fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        if fns:
            tree = ast.Module(body=fns[0].body, type_ignores=[])
    _strip_docstrings(tree)
    for node in ast.walk(tree):  # the function's name is the template's, not the program's
        if isinstance(node, ast.Name) and node.id == name:
            node.id = "_f"
        elif isinstance(node, ast.FunctionDef) and node.name == name:
            node.name = "_f"
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def prompt_signature(task: Task) -> np.ndarray:
    """MinHash of the word 3-shingles of the prompt's description (its
    examples left out: other examples do not make another task)."""
    text = description(task)
    return minhash(text, 3, tokens=words(text))


@dataclass
class Leak:
    held: str
    """The held-out task's id."""
    train: str
    """The training task it leaks from."""
    kind: str
    """`template`, `reference` or `near-duplicate`."""
    detail: str = ""


LABELS = {
    "template": "shared template",
    "reference": "same reference",
    "near-duplicate": "near-duplicate prompt",
    "prompt": "same prompt",
    "behaviour": "same behaviour",
}
"""How a summary names each kind of leak."""


@dataclass
class LeakReport:
    train_tasks: int
    held_tasks: int
    leaks: list[Leak] = field(default_factory=list)
    threshold: float = 0.8
    kinds: tuple[str, ...] = ("template", "reference", "near-duplicate")
    """The kinds of leak this check looks for (rl.tasks.instances: the instance level)."""

    @property
    def leaking(self) -> set[str]:
        """Held-out task ids that leak, in any way."""
        return {x.held for x in self.leaks}

    def counts(self) -> dict[str, int]:
        """Held-out tasks that leak, by kind (a task may count under several)."""
        out = dict.fromkeys(self.kinds, 0)
        for kind in out:
            out[kind] = len({x.held for x in self.leaks if x.kind == kind})
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "train_tasks": self.train_tasks,
            "held_tasks": self.held_tasks,
            "leaking_held_tasks": len(self.leaking),
            "by_kind": self.counts(),
            "near_duplicate_threshold": self.threshold,
            "leaks": [vars(x) for x in self.leaks],
        }

    def summary(self) -> str:
        c = self.counts()
        kinds = ", ".join(f"{LABELS.get(k, k)} {n}" for k, n in c.items())
        head = (
            f"{len(self.leaking)} of {self.held_tasks} held-out tasks leak from the {self.train_tasks} training tasks "
            f"({kinds})"
        )
        first: dict[str, Leak] = {}
        for x in self.leaks:
            first.setdefault(x.held, x)
        lines = [head] + [f"  {x.held}: {x.kind} of {x.train}{' (' + x.detail + ')' if x.detail else ''}"
                          for x in list(first.values())[:20]]  # fmt: skip
        if len(first) > 20:
            lines.append(f"  ... and {len(first) - 20} more (--json lists every one)")
        return "\n".join(lines)


def find_leaks(train: list[Task], held: list[Task], threshold: float = 0.8) -> LeakReport:
    """Every way each held-out task leaks from `train` (the first training
    task of each kind is named)."""
    report = LeakReport(len(train), len(held), threshold=threshold)
    templates: dict[str, str] = {}
    programs: dict[str, str] = {}
    for t in train:
        templates.setdefault(template(t), t.task_id)
        p = reference_program(t)
        if p is not None:
            programs.setdefault(p, t.task_id)
    for h in held:
        key = template(h)
        if key in templates:
            report.leaks.append(Leak(h.task_id, templates[key], "template"))
        p = reference_program(h)
        if p is not None and p in programs:
            report.leaks.append(Leak(h.task_id, programs[p], "reference"))
    if train and held:
        sig_train = np.stack([prompt_signature(t) for t in train])
        for h in held:
            agree = (sig_train == prompt_signature(h)[None, :]).mean(axis=1)
            i = int(np.argmax(agree))
            if agree[i] >= threshold:
                report.leaks.append(
                    Leak(h.task_id, train[i].task_id, "near-duplicate", f"estimated Jaccard {agree[i]:.2f}")
                )
    return report
