"""Task sets by role (A, B, B', U), fresh instances of a template, the
instance-level leak check, and the text-transform tasks of the positive
control."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import sarl

from rl.tasks.format import Task, read_tasks
from rl.tasks.instances import fresh, instance_leaks
from rl.tasks.leakage import find_leaks, reference_program, template
from rl.tasks.synthesis import synthesize
from rl.tasks.workspace_functions import function_workspaces


def test_fresh_instances_share_the_template_and_nothing_else() -> None:
    tasks = synthesize("composed", 40, seed=3)
    wide = {"gt", "lt", "add", "sub", "times", "clamp", "shift"}  # operations with many constants
    like = next(t for t in tasks if wide & set(t.metadata["recipe"]["ops"]))
    got = fresh(like, 6, seed=1, avoid=tasks)
    assert len(got) == 6
    assert {template(t) for t in got} == {template(like)}
    assert len({reference_program(t) for t in got} | {reference_program(like)}) == 7  # every one its own program
    assert all("repair" in t.metadata for t in got)  # drawn without the repair trace, kept with it
    assert instance_leaks(tasks, got).leaks == []  # none is an instance a training file holds
    assert find_leaks(tasks, got).counts()["template"] == 6  # and each shares its template: that is the point
    copy = got[0].model_copy(update={"task_id": "copy"})
    kinds = {x.kind for x in instance_leaks(got, [copy]).leaks}
    assert {"prompt", "reference", "behaviour", "near-duplicate"} <= kinds


def test_a_template_without_constants_has_no_fresh_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """And the draws stop once STALL of its draws in a row were its one
    program, not after all ATTEMPTS an instance (they made `sarl tasks sets`
    spend minutes on such templates)."""
    from rl.tasks import instances

    tasks = synthesize("counting", 30, seed=1, difficulty=2)  # longest_run: one program
    want, drawn = template(tasks[0]), []
    real = instances._draw

    def counted(*a: Any, **k: Any) -> Task | None:
        t = real(*a, **k)
        drawn.append(t is not None and template(t) == want)
        return t

    monkeypatch.setattr(instances, "_draw", counted)
    assert {template(t) for t in tasks} and fresh(tasks[0], 3, seed=1, avoid=tasks) == []
    assert sum(drawn) == instances.STALL and len(drawn) < instances.ATTEMPTS * 3, (sum(drawn), len(drawn))


def test_sets_leave_out_of_the_candidates_a_template_short_of_fresh_instances_for_b_prime() -> None:
    """A template that gives its candidates but not B' after them is measured
    by the band's eval (the dearest step) and then dropped: with `--fresh`,
    every template the band keeps reaches B'."""
    from rl.tasks.roles import band, make_sets

    tasks = synthesize("all", 40, seed=3)
    measured = {}
    for reserve in (0, 4):
        sets = make_sets(tasks, 0.3, 0.0, 2, seed=1, reserve=reserve)
        everywhere_in_band = {t.task_id: 0.5 for t in sets.candidates}
        got = band(sets.candidates, everywhere_in_band, 0.1, 0.8, 4, seed=1, avoid=[*sets.a, *sets.u])
        measured[reserve] = (len(got.rates), len(got.kept), sets.templates["short"])
    (before, kept_before, _), (after, kept_after, short) = measured[0], measured[4]
    assert kept_before < before, measured  # the case: measured templates the band then dropped
    assert kept_after == after and short > 0, measured  # none now: they were left out before any eval
    assert kept_after >= kept_before, measured  # and no template that reached B' was lost


def _after_docstring(t: Task) -> str:
    """A workspace reference's function past its docstring, its name masked:
    the program, told apart by its text rather than by an AST."""
    source = json.loads(t.reference)[t.entry_point.replace(".", "/") + ".py"]
    return source.split('"""', 2)[2].replace(str(t.metadata["function"]), "<F>")


def test_a_workspace_instance_of_a_trained_function_leaks_whatever_its_docstring_examples() -> None:
    """Workspaces built from the generated functions of seeds 0 and 1: where
    the two seeds drew one program (its examples and name drawn anew), the
    held task is a reference leak; where the program differs, neither the
    instruction (it names only a function and a path) nor anything else is."""
    train, held = function_workspaces(seed=0), function_workspaces(seed=1)
    programs = {_after_docstring(t) for t in train}
    same = {h.task_id for h in held if _after_docstring(h) in programs}
    modules = {t.reference for t in train}
    other_doc = [h for h in held if h.task_id in same and h.reference not in modules]
    assert len(same) >= 20 and other_doc, (len(same), len(other_doc))  # the case: one program, another docstring
    report = instance_leaks(train, held)
    assert {x.held for x in report.leaks if x.kind == "reference"} == same
    assert report.leaking == same, sorted(report.leaking ^ same)[:5]  # nothing else flagged, by prompt or otherwise

    # the same program written otherwise: the function's behaviour key travels with its workspaces
    composed = [t for t in synthesize("all", 90, seed=0) if t.metadata.get("behaviour")]
    carried = {str(t.metadata["behaviour"]) for t in train if t.metadata.get("behaviour")}
    assert composed and carried == {str(t.metadata["behaviour"]) for t in composed}
    one = next(t for t in train if t.metadata.get("behaviour"))
    rewritten = one.model_copy(
        update={
            "task_id": "rewritten",
            "reference": json.dumps(
                {
                    one.entry_point.replace(".", "/")
                    + ".py": f"def {one.metadata['function']}(*args):\n    return None\n"
                }
            ),
        }
    )
    kinds = {x.kind for x in instance_leaks([one], [rewritten]).leaks}
    assert "behaviour" in kinds and "reference" not in kinds, kinds  # the program differs, its outputs do not


@pytest.mark.slow  # 39 s alone: out of the fast tier
def test_sets_and_band_write_leak_free_files_by_role(workdir: Path) -> None:
    sarl("tasks", "generate", "-n", "300", "--seed", "2", "-o", "g.jsonl", cwd=workdir)
    out = sarl("tasks", "sets", "g.jsonl", "--held-out", "0.3", "--new", "0.2", "--seed", "2", cwd=workdir)
    assert "A: " in out.stderr and "candidates: " in out.stderr
    a, u, cand = (list(read_tasks(workdir / f"g.{n}.jsonl")) for n in ("A", "U", "candidates"))
    assert a and u and cand
    assert {t.metadata["to_warm_start"] for t in cand} == {"seen", "new"}
    # a fake measurement: a pass rate per candidate (what `sarl eval -n 8` writes, one line per task)
    rates = {}
    for i, t in enumerate(sorted({template(t) for t in cand})):
        rates[t] = [0.0, 0.5, 1.0][i % 3]
    lines = [{"task_id": t.task_id, "n": 8, "passed": int(8 * rates[template(t)]), "pass_at": {}} for t in cand]
    (workdir / "eval").mkdir()
    (workdir / "eval" / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    sarl("tasks", "band", "g.candidates.jsonl", "--results", "eval", "--band", "0.1", "0.8", "--fresh", "2",
         "--avoid", "g.A.jsonl", "g.U.jsonl", "--seed", "2", cwd=workdir)  # fmt: skip
    b, b_fresh = (list(read_tasks(workdir / f"g.{n}.jsonl")) for n in ("B", "B-fresh"))
    assert b and {rates[template(t)] for t in b} == {0.5}  # the band's templates alone
    assert {template(t) for t in b_fresh} == {template(t) for t in b} and len(b_fresh) == 2 * len(
        {template(t) for t in b}
    )
    # templates: A and B against U; instances: every training file against B' and U
    assert sarl("tasks", "leaks", "g.A.jsonl", "g.B.jsonl", "g.U.jsonl", cwd=workdir).returncode == 0
    for held in ("g.B-fresh.jsonl", "g.U.jsonl"):
        got = sarl("tasks", "leaks", "g.A.jsonl", "g.B.jsonl", held, "--level", "instances", cwd=workdir)
        assert got.returncode == 0 and "instances: 0 of" in got.stdout
    # and B' does share its templates with B: a template-level check says so
    said = sarl("tasks", "leaks", "g.B.jsonl", "g.B-fresh.jsonl", "--level", "both", "--json", cwd=workdir, check=False)
    report = json.loads(said.stdout)
    assert said.returncode == 1 and report["templates"]["by_kind"]["template"] == len(b_fresh)
    assert report["instances"]["leaking_held_tasks"] == 0


@pytest.mark.slow  # 29 s alone: out of the fast tier
def test_band_refuses_a_measurement_that_keeps_nothing(workdir: Path) -> None:
    sarl("tasks", "generate", "-n", "120", "--seed", "2", "-o", "g.jsonl", cwd=workdir)
    sarl("tasks", "sets", "g.jsonl", "--held-out", "0.3", "--seed", "2", cwd=workdir)
    cand = list(read_tasks(workdir / "g.candidates.jsonl"))
    lines = [{"task_id": t.task_id, "n": 8, "passed": 0, "pass_at": {}} for t in cand]
    (workdir / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = sarl("tasks", "band", "g.candidates.jsonl", "--results", "r.jsonl", cwd=workdir, check=False)
    assert out.returncode == 2 and "no candidate template has a pass rate in" in out.stderr and "max 0.00" in out.stderr
    assert not (workdir / "g.B.jsonl").exists()


def test_band_names_every_bad_line_of_its_results_and_checks_its_arguments_first(workdir: Path) -> None:
    sarl("tasks", "generate", "-n", "12", "--seed", "2", "-o", "c.jsonl", cwd=workdir)
    lines = ['{"task_id": "a", "n": 8, "passed": 3}', "not json", "[1]", '{"n": 8, "passed": 1}',
             '{"task_id": "a", "n": 8, "passed": 3}', '{"task_id": "b", "n": 0, "passed": 0}',
             '{"task_id": "c", "n": 8, "passed": 9}', '{"task_id": "d", "n": 8, "passed": true}',
             '{"task_id": "e", "reward_mean": 0.5}']  # fmt: skip
    (workdir / "r.jsonl").write_text("\n".join(lines) + "\n")
    out = sarl("tasks", "band", "c.jsonl", "--results", "r.jsonl", cwd=workdir, check=False)
    whole = "passed, n: whole numbers with 0 <= passed <= n and n >= 1 are required, got"
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.removeprefix("sarl tasks band: ").splitlines() == [
        "r.jsonl:2: not valid JSON: Expecting value",
        "r.jsonl:3: expected a JSON object, got list",
        "r.jsonl:4: task_id: required string field is missing (a line of `sarl eval`'s results.jsonl)",
        "r.jsonl:5: task_id 'a' already used on line 1",
        f"r.jsonl:6: {whole} 0, 0",
        f"r.jsonl:7: {whole} 9, 8",
        f"r.jsonl:8: {whole} True, 8",
        "r.jsonl:9: passed, n: missing: not a line of `sarl eval`'s results.jsonl",
    ]
    by_reward = sarl("tasks", "band", "c.jsonl", "--results", "r.jsonl", "--by", "reward", cwd=workdir, check=False)
    assert by_reward.returncode == 2 and "r.jsonl:1: reward_mean: a number from 0 to 1 is required" in by_reward.stderr
    assert "r.jsonl:9" not in by_reward.stderr  # its reward_mean is all --by reward needs
    for args, why in ((["none.jsonl"], "none.jsonl: no such file"),
                      (["none.jsonl", "--band", "0.8", "0.1"], "--band 0.8 0.1: 0 <= low < high <= 1"),
                      (["none.jsonl", "--fresh", "0"], "--fresh 0: at least one fresh instance")):  # fmt: skip
        out = sarl("tasks", "band", "c.jsonl", "--results", *args, cwd=workdir, check=False)
        assert out.returncode == 2 and why in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not list(workdir.glob("c.B*"))


def test_band_by_reward_chooses_text_templates_that_pass_nothing_yet(workdir: Path) -> None:
    """Partial credit has signal long before an exact answer: text templates
    are banded by their mean reward; by pass rate none would be kept."""
    sarl("tasks", "generate", "--family", "text", "-n", "64", "--seed", "1", "-o", "g.jsonl", cwd=workdir)
    sarl("tasks", "sets", "g.jsonl", "--held-out", "0.25", "--candidates", "2", "--seed", "1", cwd=workdir)
    cand = list(read_tasks(workdir / "g.candidates.jsonl"))
    names = sorted({template(t) for t in cand})
    reward = {n: [0.05, 0.5, 0.95][i % 3] for i, n in enumerate(names)}
    lines = [{"task_id": t.task_id, "n": 8, "passed": 0, "reward_mean": reward[template(t)]} for t in cand]
    (workdir / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    by_pass = sarl("tasks", "band", "g.candidates.jsonl", "--results", "r.jsonl", cwd=workdir, check=False)
    assert by_pass.returncode == 2 and not (workdir / "g.B.jsonl").exists()
    out = sarl("tasks", "band", "g.candidates.jsonl", "--results", "r.jsonl", "--by", "reward", "--fresh", "3",
               "--avoid", "g.A.jsonl", "g.U.jsonl", cwd=workdir)  # fmt: skip
    assert "with a reward rate in [0.1, 0.8]" in out.stderr
    b, b_fresh = (list(read_tasks(workdir / f"g.{n}.jsonl")) for n in ("B", "B-fresh"))
    kept = {n for n in names if reward[n] == 0.5}
    assert {template(t) for t in b} == kept and {template(t) for t in b_fresh} == kept
    assert len(b_fresh) == 3 * len(kept)
    assert sarl("tasks", "leaks", "g.A.jsonl", "g.B.jsonl", "g.B-fresh.jsonl", "--level", "instances",
                cwd=workdir).returncode == 0  # fmt: skip


# ------------------------------------------------------------ text transforms


def test_text_tasks_are_graded_by_lcs_ratio_with_exact_text_to_pass() -> None:
    from rl.tasks.texts import TRANSFORMS, text_tasks
    from rl.verify.verifier import Verifier

    tasks = text_tasks(sorted(TRANSFORMS), 16, seed=1)
    assert {t.metadata["template"] for t in tasks} == set(TRANSFORMS)
    t = next(t for t in tasks if t.metadata["template"] == "reverse-words")
    words = t.prompt.rpartition("Text: ")[2].split()
    assert t.reference == " ".join(words[::-1])
    with Verifier() as v:
        exact = v.verify(t, t.reference)
        close = v.verify(t, " ".join(words[::-1][:-1]))  # one word short
        chatter = v.verify(t, "Sure! Here is the text: " + t.reference)
        nothing = v.verify(t, "")
    assert exact.passed and exact.reward == 1.0
    assert not close.passed and 0.6 < close.reward < 1.0 and "LCS ratio" in close.failure
    assert not chatter.passed and 0.3 < chatter.reward < close.reward + 0.2
    assert nothing.reward == 0.0 and nothing.failure == "no answer"


def test_text_tasks_validate_and_have_fresh_instances(workdir: Path) -> None:
    sarl("tasks", "generate", "--family", "text", "-n", "24", "--seed", "1", "-o", "t.jsonl", cwd=workdir)
    out = sarl("tasks", "validate", "t.jsonl", "--repeats", "1", cwd=workdir)
    assert "24 of 24 tasks are clean" in out.stderr
    tasks = list(read_tasks(workdir / "t.jsonl"))
    got = fresh(tasks[0], 5, seed=2, avoid=tasks)
    assert len(got) == 5 and {t.metadata["template"] for t in got} == {tasks[0].metadata["template"]}
    assert instance_leaks(tasks, got).leaks == []


@pytest.mark.parametrize(("reply", "answer"), [("a b c", "a b c"), ("ok <answer> a b </answer> done", "a b")])
def test_a_text_reply_is_its_answer_or_what_its_answer_tags_hold(reply: str, answer: str) -> None:
    from rl.agent.text import answer_of

    assert answer_of(reply) == answer
