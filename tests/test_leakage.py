"""Held-out sets that are held out: the leakage check (shared templates,
the same reference program, near-duplicate prompts) and `sarl tasks split`,
which holds out whole templates or families and leaves nothing that leaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import sarl

from rl.tasks.format import Task, read_tasks, write_tasks
from rl.tasks.leakage import find_leaks, reference_program, template


def _task(tid: str, name: str, doc: str, body: str, examples: str = "", family: str = "f") -> Task:
    prompt = f'def {name}(xs: list) -> int:\n    """\n    {doc}\n{examples}    """\n'
    tests = f"def check(candidate):\n    assert candidate([1]) == candidate([1])\n\ncheck({name})\n"
    return Task(task_id=tid, prompt=prompt, entry_point=name, tests=tests, reference=body,
                metadata={"family": family})  # fmt: skip


def test_a_template_is_the_prompt_before_its_examples_with_names_strings_and_numbers_masked() -> None:
    a = _task("a", "count_big", "Return how many items of xs exceed 7 and differ from 'ab'.", "    return 0\n",
              "    >>> count_big([8, 9])\n    2\n")  # fmt: skip
    b = _task("b", "tally_over", "Return how many items of xs exceed 12 and differ from 'zz'.", "    return 1\n",
              "    >>> tally_over([1])\n    0\n")  # fmt: skip
    c = _task("c", "count_big", "Return how many items of xs are below 7 and differ from 'ab'.", "    return 2\n")
    assert template(a) == template(b)  # other constants, another name, other examples: one template
    assert template(a) != template(c)  # another program asked for
    report = find_leaks([a], [b, c])
    assert [(x.held, x.kind) for x in report.leaks] == [("b", "template")] and report.leaking == {"b"}


def test_a_reference_program_is_compared_as_an_ast_without_names_docstrings_or_layout() -> None:
    body = "    total = 0\n    for x in xs:  # each\n        total += x * 2\n    return total\n"
    whole = 'def other(xs):\n    """Doubled sum."""\n    total = 0\n    for x in xs:\n        total += (x * 2)\n'
    whole += "    return total\n"
    a = _task("a", "double_sum", "Sum of the doubled items.", body)
    b = _task("b", "other", "Twice each element, added up, for a list that may hold negatives.", whole)
    c = _task("c", "triple_sum", "Sum of the tripled items.", body.replace("* 2", "* 3"))
    assert reference_program(a) is not None and reference_program(a) == reference_program(b)
    assert reference_program(a) != reference_program(c)
    assert reference_program(_task("d", "f", "No reference.", "")) is None
    assert [(x.held, x.kind, x.train) for x in find_leaks([a], [b, c]).leaks] == [("b", "reference", "a")]


def test_a_reworded_prompt_is_a_near_duplicate() -> None:
    doc = (
        "Return the length of the longest run of equal adjacent items in xs, where a run is a maximal "
        "sequence of consecutive positions holding the same value, and an empty list has no run at all."
    )
    a = _task("a", "longest_run", doc, "    return 0\n")
    b = _task("b", "longest_run", doc.replace("an empty list has no run at all", "an empty list gives zero"),
              "    return 1\n")  # fmt: skip
    assert template(a) != template(b)
    report = find_leaks([a], [b])
    assert [x.kind for x in report.leaks] == ["near-duplicate"] and "Jaccard" in report.leaks[0].detail
    assert find_leaks([a], [b], threshold=1.0).leaks == []


def test_split_holds_out_whole_templates_leaves_no_leak_and_is_deterministic(workdir: Path) -> None:
    sarl("tasks", "generate", "--family", "classic", "-n", "264", "--seed", "1", "-o", "g.jsonl", cwd=workdir)
    out = sarl("tasks", "split", "g.jsonl", "--held-out", "0.3", "--seed", "3", cwd=workdir)
    assert "templates held out whole" in out.stderr and "leak check: 0 leak" in out.stderr
    train, held = list(read_tasks(workdir / "g.train.jsonl")), list(read_tasks(workdir / "g.heldout.jsonl"))
    assert len(train) + len(held) == 264 and not {t.task_id for t in train} & {t.task_id for t in held}
    assert {template(t) for t in train}.isdisjoint({template(t) for t in held})
    assert len(held) >= 30 and len({t.metadata["family"] for t in held}) >= 3
    assert sarl("tasks", "leaks", "g.train.jsonl", "g.heldout.jsonl", cwd=workdir).returncode == 0
    first = (workdir / "g.heldout.jsonl").read_text()
    sarl("tasks", "split", "g.jsonl", "--held-out", "0.3", "--seed", "3", "--heldout", "h2.jsonl", cwd=workdir)
    assert (workdir / "h2.jsonl").read_text() == first
    sarl("tasks", "split", "g.jsonl", "--held-out", "0.3", "--seed", "4", "--heldout", "h3.jsonl", cwd=workdir)
    assert (workdir / "h3.jsonl").read_text() != first
    # by family: no family on both sides
    sarl("tasks", "split", "g.jsonl", "--held-out", "0.3", "--by", "family", "--train", "ft.jsonl",
         "--heldout", "fh.jsonl", cwd=workdir)  # fmt: skip
    fam = lambda p: {t.metadata["family"] for t in read_tasks(workdir / p)}  # noqa: E731
    assert fam("ft.jsonl").isdisjoint(fam("fh.jsonl")) and fam("fh.jsonl")
    # a split by task (every 4th task held out, as splits used to be) leaks, and the check says how
    tasks = list(read_tasks(workdir / "g.jsonl"))
    write_tasks(workdir / "rt.jsonl", [t for i, t in enumerate(tasks) if i % 4])
    write_tasks(workdir / "rh.jsonl", tasks[::4])
    bad = sarl("tasks", "leaks", "rt.jsonl", "rh.jsonl", "--json", cwd=workdir, check=False)
    assert bad.returncode == 1
    report = json.loads(bad.stdout)["templates"]
    assert report["leaking_held_tasks"] == report["by_kind"]["template"] == 66 and report["by_kind"]["reference"] > 0
    text = sarl("tasks", "leaks", "rt.jsonl", "rh.jsonl", cwd=workdir, check=False).stdout
    assert "templates: 66 of 66 held-out tasks leak" in text and ": template of " in text


def test_a_held_out_task_leaking_through_another_template_moves_to_training() -> None:
    """Two templates whose reference programs are the same: whichever side
    the split puts their tasks on, none of them stays held out while the
    other trains."""
    from rl.tasks.split import split_tasks

    body = "    return sum(1 for x in xs if x > 3)\n"
    tasks = [_task(f"a{i}", "count_a", f"Items of xs over {i}, counted.", body) for i in range(4)]
    tasks += [_task(f"b{i}", "count_b", f"How many entries of xs are larger than {i}?", body) for i in range(4)]
    tasks += [
        _task(f"c{i}", "other_c", f"Return the largest of xs plus {i}, or {i} when xs is empty.", f"    return {i}\n")
        for i in range(4)
    ]
    s = split_tasks(tasks, 0.4, seed=0)
    held_templates = {template(t) for t in s.held}
    assert s.held and s.leaks.leaks == [] and find_leaks(s.train, s.held).leaks == []
    assert held_templates.isdisjoint({template(t) for t in s.train})
    if held_templates & {template(t) for t in tasks if t.task_id.startswith(("a", "b"))}:
        raise AssertionError("a template sharing its program with a trained one was held out")


def test_split_and_leaks_refuse_what_cannot_hold(workdir: Path) -> None:
    one = [_task(f"t{i}", "count_big", f"Return how many items of xs exceed {i}.", "    return 0\n") for i in range(5)]
    write_tasks(workdir / "one.jsonl", one)
    out = sarl("tasks", "split", "one.jsonl", "--held-out", "0.3", cwd=workdir, check=False)
    assert out.returncode == 2 and "have 1 template" in out.stderr and "at least 2" in out.stderr
    assert not (workdir / "one.train.jsonl").exists() and not (workdir / "one.heldout.jsonl").exists()
    out = sarl("tasks", "split", "one.jsonl", "--held-out", "1.5", cwd=workdir, check=False)
    assert out.returncode == 2 and "--held-out 1.5" in out.stderr
    out = sarl("tasks", "leaks", "one.jsonl", "missing.jsonl", cwd=workdir, check=False)
    assert out.returncode == 2 and "missing.jsonl" in out.stderr


@pytest.mark.slow
def test_validate_against_a_training_file_marks_leaking_tasks_not_clean(workdir: Path) -> None:
    sarl("tasks", "generate", "--family", "classic", "-n", "44", "--seed", "2", "-o", "g.jsonl", cwd=workdir)
    tasks = list(read_tasks(workdir / "g.jsonl"))
    write_tasks(workdir / "train.jsonl", tasks[:33])  # one task of each family and level
    from rl.tasks.importers import import_humaneval

    held = tasks[33:36] + import_humaneval()[:2]  # 3 of a second round of templates, 2 of HumanEval
    write_tasks(workdir / "held.jsonl", held)
    leaking = find_leaks(tasks[:33], held).leaking
    assert leaking == {t.task_id for t in held[:3]}, leaking
    out = sarl("tasks", "validate", "held.jsonl", "--against", "train.jsonl", cwd=workdir, timeout=600)
    clean = {t.task_id for t in read_tasks(workdir / "held.clean.jsonl")}
    assert clean == {t.task_id for t in held[3:]}
    report = json.loads((workdir / "held.report.json").read_text())
    why = {r["task_id"]: r["problems"] for r in report["reports"]}
    assert all(any(p.startswith("leaks: ") and "train.jsonl" in p for p in why[t]) for t in leaking)
    assert "2 of 5 tasks are clean" in out.stderr and "3 of 5 held-out tasks leak" in out.stderr


def test_tool_tasks_are_enough_to_hold_out_whole_databases_and_whole_templates(workdir: Path) -> None:
    """SQL: 9 databases, held out whole by family. Workspace: the 216 built
    from generated functions carry their function's template, so a split by
    template keeps a function's three kinds (and the function task itself)
    on one side; a split by task leaks, and the check names the template."""
    from collections import Counter

    sarl("tasks", "generate", "--family", "sql", "-o", "sql.jsonl", cwd=workdir)
    sql = list(read_tasks(workdir / "sql.jsonl"))
    assert len(sql) >= 300 and len({t.metadata["family"] for t in sql}) == 9
    out = sarl("tasks", "split", "sql.jsonl", "--by", "family", "--held-out", "0.3", cwd=workdir)
    assert "leak check: 0 leak" in out.stderr
    databases = lambda p: Counter(t.metadata["family"] for t in read_tasks(workdir / p))  # noqa: E731
    held, train = databases("sql.heldout.jsonl"), databases("sql.train.jsonl")
    assert held.keys().isdisjoint(train) and len(held) >= 2 and sum(held.values()) >= 60, (held, train)
    assert sarl("tasks", "leaks", "sql.train.jsonl", "sql.heldout.jsonl", cwd=workdir).returncode == 0

    sarl("tasks", "generate", "--family", "workspace", "--seed", "2", "-o", "ws.jsonl", cwd=workdir)
    ws = list(read_tasks(workdir / "ws.jsonl"))
    built = [t for t in ws if t.metadata["source"] == "sarl-workspace-generated"]
    assert len(ws) >= 200 and len(built) >= 150
    assert {t.metadata["family"] for t in built} == {"workspace-fix", "workspace-implement", "workspace-make-pass"}
    by_function = Counter(template(t) for t in built)
    assert max(by_function.values()) >= 3 and len(by_function) >= 30  # kinds and instances share one
    out = sarl("tasks", "split", "ws.jsonl", "--held-out", "0.3", "--seed", "1", cwd=workdir)
    assert "leak check: 0 leak" in out.stderr
    train_t = {template(t) for t in read_tasks(workdir / "ws.train.jsonl")}
    held_t = {template(t) for t in read_tasks(workdir / "ws.heldout.jsonl")}
    assert train_t.isdisjoint(held_t) and len(held_t) >= 10
    # the fix task held out while its implement task trains: a leak of the function's template
    pair = [t for t in built if template(t) == template(built[0])]
    write_tasks(workdir / "one.jsonl", pair[:1])
    write_tasks(workdir / "other.jsonl", pair[1:2])
    bad = sarl("tasks", "leaks", "one.jsonl", "other.jsonl", "--json", cwd=workdir, check=False)
    assert bad.returncode == 1 and json.loads(bad.stdout)["templates"]["by_kind"]["template"] == 1
