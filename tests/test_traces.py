"""Tool traces (rl.tasks.traces): correct trajectories of SQL and workspace
tasks built from their references, replayed in the task's own environment
(rl.episodes.replay: the episode loop of rollouts, real sandboxes, the real
verifier), and `sarl tasks traces`, which writes them only when every one
scores 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import sarl, wait_for, write_config
from learner_runs import learner_config, learner_state

from rl.episodes.replay import check_traces, replay
from rl.tasks.format import read_tasks, write_tasks
from rl.tasks.sql import sql_tasks
from rl.tasks.traces import Trace, call, edit, traces
from rl.tasks.workspace_functions import function_workspaces
from rl.tasks.workspaces import workspace_tasks
from rl.verify.config import VerifyConfig
from rl.verify.verifier import Verifier
from sandboxes import open_sandbox


def test_a_trace_is_the_episode_format_and_a_repair_takes_a_wrong_step_first() -> None:
    sql = sql_tasks()[0]
    [direct, repair] = traces(sql, repair_share=1.0)
    assert direct.kind == "direct" and repair.kind == "repair" and len(repair.replies) == len(direct.replies) + 1
    assert direct.replies[-1].endswith(call("answer", query=sql.reference))
    assert "missing_column" in repair.replies[0]
    impl = next(t for t in function_workspaces() if t.task_id.endswith("/implement") and "first_attempt" in t.metadata)
    [_, fix_first] = traces(impl, repair_share=1.0)
    [(path, fixed)] = json.loads(impl.reference).items()
    calls = [json.loads(r.split("<tool_call>")[1].removesuffix("</tool_call>")) for r in fix_first.replies]
    # the test file (the calls and the values they must return) is read before the first test run and edit
    test_file = next(p for p in impl.files if p.startswith("tests/test_"))
    assert [c["name"] for c in calls[:3]] == ["read_file", "read_file", "shell"]
    assert [c["arguments"]["path"] for c in calls[:2]] == [path, test_file]
    text, states = impl.files[path], []
    for c in calls:
        if c["name"] == "edit_file":  # each edit's old text is in the file once; the def and docstring stay
            assert text.count(c["arguments"]["old"]) == 1 and '"""' not in c["arguments"]["old"] + c["arguments"]["new"]
            text = text.replace(c["arguments"]["old"], c["arguments"]["new"])
            states.append(text)
    assert states == [impl.metadata["first_attempt"], fixed] and calls[-1]["name"] == "submit"
    assert fix_first.untrained == (3,) and repair.untrained == (0,)  # the wrong steps: context, not trained
    # fix and make-pass tasks repair too: their wrong edit is another bug (hand-written units have two)
    # or a small mutation of the reference; never the file as given, never the reference
    ws = workspace_tasks() + function_workspaces()
    for t in ws:
        [(path, fixed)] = json.loads(t.reference).items()
        assert t.metadata.get("first_attempt") not in (t.files[path], fixed)
    kinds = {t.metadata["family"] for t in ws if "first_attempt" in t.metadata}
    assert kinds == {"workspace-fix", "workspace-implement", "workspace-make-pass"}
    fix = next(t for t in workspace_tasks() if t.task_id.endswith("/fix"))
    assert [t.kind for t in traces(fix, repair_share=1.0)] == ["direct", "repair"]
    assert traces(sql.model_copy(update={"test_format": "humaneval"})) == []
    # the share is drawn from the task id: the same on every machine, near the share asked
    drawn = [len(traces(t, 0.3)) == 2 for t in sql_tasks()]
    assert drawn == [len(traces(t, 0.3)) == 2 for t in sql_tasks()] and 0.2 < sum(drawn) / len(drawn) < 0.4


def test_a_refused_trace_retypes_the_old_text_wrong_then_copies_it() -> None:
    """Every workspace task can have one; its refused edit's `old` is not in
    the file (so `edit_file` refuses it) and differs from the right one in
    whitespace alone; the next reply is the direct edit; SQL has none."""
    ws = workspace_tasks() + function_workspaces()
    tabbed = 0
    for t in ws:
        [direct, refused] = traces(t, repair_share=0.0, refused_share=1.0)
        assert refused.kind == "refused" and refused.untrained == (3,)
        assert refused.replies[:3] == direct.replies[:3] and refused.replies[5:] == direct.replies[4:]
        call_of = lambda r: r.split("<tool_call>")[1]  # noqa: E731
        assert call_of(refused.replies[4]) == call_of(direct.replies[3])  # then the direct trace's edit
        [(path, fixed)] = json.loads(t.reference).items()
        wrong = json.loads(refused.replies[3].split("<tool_call>")[1].removesuffix("</tool_call>"))["arguments"]
        right = edit(t.files[path], fixed)
        assert wrong["path"] == path and wrong["new"] == right["new"] and wrong["old"] not in t.files[path]
        assert "".join(wrong["old"].split()) == "".join(right["old"].split())  # whitespace alone differs
        tabbed += "\t" in wrong["old"]
    assert 0 < tabbed < len(ws)  # a one-line old text cannot lose its indentation and be refused
    assert [x.kind for x in traces(sql_tasks()[0], repair_share=1.0, refused_share=1.0)] == ["direct", "repair"]
    drawn = [len(traces(t, 0.0, 0.3)) == 2 for t in ws]  # drawn apart from the repair share
    assert 0.15 < sum(drawn) / len(drawn) < 0.45 and drawn != [len(traces(t, 0.3)) == 2 for t in ws]


def test_every_turn_limit_of_a_tool_episode_holds_the_longest_trace_of_its_kind() -> None:
    """The limits are written by hand (bench learn's evaluation, examples/tools-rl.toml);
    a trace that grows past one would be cut short in evaluation and RL alike."""
    import tomllib

    from rl.bench.tool_gain import EVAL_TURNS

    longest = {
        kind: max(len(t.replies) for task in tasks for t in traces(task, repair_share=1.0, refused_share=1.0))
        for kind, tasks in (("sql", sql_tasks()), ("workspace", workspace_tasks() + function_workspaces()))
    }
    assert longest["workspace"] > longest["sql"] >= 3  # a repair trace is the longest of each
    assert all(EVAL_TURNS[kind] >= n for kind, n in longest.items()), (EVAL_TURNS, longest)
    rl_toml = tomllib.loads((Path(__file__).parents[1] / "examples" / "tools-rl.toml").read_text())
    assert rl_toml["rollout"]["agent"]["max_turns"] >= max(longest.values()), longest


def test_an_edit_is_the_lines_that_differ_widened_until_the_old_text_is_there_once() -> None:
    before = "def f(x):\n    y = 1\n    return y\n\n\ndef g(x):\n    y = 1\n    return y\n"
    after = before.replace("    y = 1\n    return y\n", "    y = 2\n    return y\n", 1)
    e = edit(before, after)  # `    y = 1` is there twice: the def line above it makes it unique
    assert e == {"old": "def f(x):\n    y = 1\n", "new": "def f(x):\n    y = 2\n"}
    assert before.replace(e["old"], e["new"]) == after
    inserted = edit("a\nb\n", "a\nx\nb\n")  # nothing removed: a neighbouring line is the anchor
    assert inserted == {"old": "a\n", "new": "a\nx\n"}
    with pytest.raises(ValueError, match="the same"):
        edit("a\n", "a\n")


def test_a_trace_with_a_call_in_the_wrong_format_scores_as_the_environment_says(tok: Any) -> None:
    sql, ws = sql_tasks()[5], workspace_tasks()[0]
    [good] = traces(sql, repair_share=0.0)
    broken = '<tool_call>{"name": "answer", "arguments": {"query": </tool_call>'
    bad_sql = Trace(sql.task_id, "direct", [good.replies[0], broken])
    [ws_good] = traces(ws, repair_share=0.0)
    bad_ws = Trace(ws.task_id, "direct", [*ws_good.replies[:-1], "Done, I think: submit()"])
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = replay(sql, bad_sql, tok, sb, verifier)
        assert ep.tool_failures["malformed-call"] == 1 and ep.end == "max-turns" and ep.verdict.reward == 0.0
        sb.reset()
        ep = replay(ws, bad_ws, tok, sb, verifier)
        assert ep.tool_failures["no-call"] == 1 and ep.end == "max-turns"
    got = check_traces([(sql, good), (sql, bad_sql), (ws, ws_good), (ws, bad_ws)], tok)
    assert [r.ok for r in got] == [True, False, True, False]
    assert got[1].invalid_calls == 1 and got[1].reward == 0.0


def test_sarl_tasks_traces_writes_nothing_when_a_trace_fails_and_refuses_a_file_without_tool_tasks(
    workdir: Path,
) -> None:
    tasks = sql_tasks()[:6] + function_workspaces(functions=3)
    write_tasks(workdir / "t.jsonl", tasks)
    out = sarl("tasks", "traces", "t.jsonl", "--repair-share", "0.5", "--refused-share", "0.5", cwd=workdir)
    lines = [json.loads(x) for x in (workdir / "t.traces.jsonl").read_text().splitlines()]
    assert {x["task_id"] for x in lines} == {t.task_id for t in tasks} and "to reward 1" in out.stderr
    assert {x["kind"] for x in lines} == {"direct", "repair", "refused"}
    refused = sum(x["kind"] == "refused" for x in lines)
    assert f", {refused} answering a refused edit)" in out.stderr
    # a task whose hidden check disagrees with its reference: the trace fails, nothing is written
    wrong = tasks[0].model_copy(update={"tests": json.dumps({"reference": "SELECT 1", "ordered": False})})
    write_tasks(workdir / "w.jsonl", [wrong, *tasks[1:3]])
    bad = sarl("tasks", "traces", "w.jsonl", "-o", "w.out.jsonl", cwd=workdir, check=False)
    assert bad.returncode == 1 and wrong.task_id in bad.stderr and "nothing written" in bad.stderr
    assert not (workdir / "w.out.jsonl").exists()
    sarl("tasks", "generate", "-n", "3", "-o", "f.jsonl", cwd=workdir)
    none = sarl("tasks", "traces", "f.jsonl", cwd=workdir, check=False)
    assert none.returncode == 2 and "nothing to trace" in none.stderr
    share = sarl("tasks", "traces", "t.jsonl", "--repair-share", "1.5", cwd=workdir, check=False)
    assert share.returncode == 2 and "--repair-share 1.5" in share.stderr
    share = sarl("tasks", "traces", "t.jsonl", "--refused-share", "-0.1", cwd=workdir, check=False)
    assert share.returncode == 2 and "--refused-share -0.1" in share.stderr
    # a task whose reference gives no trace: named with the field that is wrong, before any replay
    ws = next(t for t in tasks if t.test_format == "workspace" and "first_attempt" in t.metadata)
    [(path, fixed)] = json.loads(ws.reference).items()
    broken = {
        "already is its reference": ws.model_copy(update={"files": {**ws.files, path: fixed}}),
        "reference: one file": ws.model_copy(update={"reference": json.dumps({path: fixed, "x.py": ""})}),
        "metadata.first_attempt": ws.model_copy(update={"metadata": {**ws.metadata, "first_attempt": fixed}}),
        "reference: no query": tasks[0].model_copy(update={"reference": " "}),
    }
    for why, task in broken.items():
        write_tasks(workdir / "b.jsonl", [*tasks[1:3], task.model_copy(update={"task_id": "broken"})])
        bad = sarl("tasks", "traces", "b.jsonl", "-o", "b.out.jsonl", "--repair-share", "1", cwd=workdir, check=False)
        assert bad.returncode == 2 and "broken: no trace from its reference: " in bad.stderr and why in bad.stderr
        assert "1 of 3 tasks" in bad.stderr and "Traceback" not in bad.stderr and not (workdir / "b.out.jsonl").exists()


@pytest.mark.slow  # about 2 min: every shipped SQL and workspace task
def test_every_shipped_trace_replays_to_reward_1(workdir: Path) -> None:
    for family, refused in (("sql", []), ("workspace", ["--refused-share", "1"])):
        sarl("tasks", "generate", "--family", family, "-o", f"{family}.jsonl", cwd=workdir)
        out = sarl("tasks", "traces", f"{family}.jsonl", *refused, cwd=workdir)
        lines = [json.loads(x) for x in (workdir / f"{family}.traces.jsonl").read_text().splitlines()]
        tasks = list(read_tasks(workdir / f"{family}.jsonl"))
        assert {x["task_id"] for x in lines} == {t.task_id for t in tasks}, out.stderr
        assert sum(x["kind"] == "repair" for x in lines) >= 20
        # every workspace task answers a refused edit too
        assert sum(x["kind"] == "refused" for x in lines) == (len(tasks) if refused else 0)


def _written_traces(workdir: Path, tasks: list[Any]) -> list[dict[str, Any]]:
    write_tasks(workdir / "tools.jsonl", tasks)
    sarl("tasks", "traces", "tools.jsonl", "--repair-share", "1", "--refused-share", "1", cwd=workdir)
    return [json.loads(x) for x in (workdir / "tools.traces.jsonl").read_text().splitlines()]


def test_the_warm_starts_loss_covers_only_the_policys_replies(workdir: Path, tok: Any) -> None:
    """SFT on traces (rl.learner.trace_data) trains on exactly the trace's
    replies, each with its end of turn, in the episode's tokens: never the
    prompt, the tool protocol or a tool's result."""
    from rl.learner.trace_data import Traces, read_traces

    fix = next(
        t for t in function_workspaces(functions=8) if t.task_id.endswith("/fix") and "first_attempt" in t.metadata
    )
    lines = _written_traces(workdir, [sql_tasks()[3], fix])
    assert [x["kind"] for x in lines] == ["direct", "repair", "direct", "repair", "refused"]
    assert [x["untrained"] for x in lines] == [[], [0], [], [3], [3]]
    data = Traces(workdir / "tools.traces.jsonl", tok, seed=0, max_tokens=16384)
    samples = {(s.task_id, len(s.tokens)): s for s in data.step(0, 5)}
    assert len(samples) == 5  # one pass: every trace once
    for line in lines:
        s = samples[(line["task_id"], len(line["tokens"]))]
        mask = s.loss_mask.astype(bool)
        trained = tok.decode(s.tokens[mask])
        policy = [r for i, r in enumerate(line["replies"]) if i not in line["untrained"]]
        assert trained == "".join(r + "<|im_end|>" for r in policy)  # the replies and nothing else
        context = tok.decode(s.tokens[~mask])
        for i in line["untrained"]:  # a wrong step is context, and what it got showed it wrong
            assert line["replies"][i] in context
            shown = context.split(line["replies"][i])[1]
            want = {"refused": "the old text is not in the file", "repair": "FAIL"}[line["kind"]]
            assert want in shown or "no such column" in context
        assert "tool_call" in context and ("[sql]" in context or "PASS" in context)  # observations: context
        assert not any(o in trained for o in ("[sql]", "PASS", "FAIL", "(1 row)"))
    # another tokenizer's ids are refused, naming the file; so is a line that is not a trace
    other = workdir / "other.jsonl"
    other.write_text(json.dumps({**lines[0], "tokenizer": "49152-0000"}) + "\n")
    with pytest.raises(ValueError, match="another tokenizer"):
        Traces(other, tok, seed=0)
    other.write_text(json.dumps({**lines[0], "loss_mask": lines[0]["loss_mask"][:-1]}) + "\n")
    with pytest.raises(ValueError, match="other.jsonl:1: loss_mask"):
        read_traces(other)


def test_a_traces_file_with_bad_lines_is_refused_before_submission_naming_each(workdir: Path, tiny_model: Path) -> None:
    good = {"task_id": "a", "tokenizer": "x", "tokens": [1, 2, 3], "loss_mask": [0, 1, 1]}
    bad = [
        "not json",
        [1],
        {"task_id": "b"},
        {**good, "loss_mask": [0, 1]},
        {**good, "loss_mask": [0, 0, 0]},
        {**good, "loss_mask": [0, 2, 1]},
        {**good, "tokens": [1, -2, 3]},
    ]
    lines = [json.dumps(good)] + [x if isinstance(x, str) else json.dumps(x) for x in bad]
    (workdir / "t.jsonl").write_text("\n".join(lines) + "\n")
    loss = {"type": "sft", "source": "traces", "traces_file": "t.jsonl"}
    out = sarl("submit", str(write_config(workdir, learner_config(tiny_model, 2, {"loss": loss}))), cwd=workdir,
               check=False)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    mask = "loss_mask: as many values as tokens, each 0 or 1, some of them 1"
    for n, why in ((2, "not valid JSON"), (3, "expected a JSON object, got list"),
                   (4, "tokenizer: missing or not a str; tokens: missing or not a list; loss_mask: missing"),
                   (5, mask), (6, mask), (7, mask), (8, "tokens: token ids, whole numbers from 0")):  # fmt: skip
        assert f"t.jsonl:{n}: {why}" in out.stderr, (n, out.stderr)
    assert "t.jsonl:1:" not in out.stderr and not (workdir / "runs" / "l").exists()


@pytest.mark.slow
def test_sft_on_tool_traces_lowers_their_loss_and_reads_no_rollouts(workdir: Path, tiny_model: Path) -> None:
    from rl.store import Store

    _written_traces(workdir, sql_tasks()[:2])
    loss = {"type": "sft", "source": "traces", "traces_file": "tools.traces.jsonl"}
    body = learner_config(tiny_model, 6, {"optimizer": {"lr": 1e-2}, "loss": loss})
    sarl("submit", str(write_config(workdir, body)), cwd=workdir)
    run = workdir / "runs" / "l"
    try:
        wait_for(lambda: learner_state(run).get("done"), 400, "the SFT learner")
        state = learner_state(run)
        assert state["step"] == 6 and state["batches"] == 0  # no rollout read
        assert Store(run / "store.zarr").weights.latest() == 6
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run / "tb" / "learner"), size_guidance={"scalars": 0})
        acc.Reload()
        losses = [e.value for e in acc.Scalars("learner/loss")]
        assert len(losses) == 6 and losses[-1] < 0.9 * losses[0], losses  # the 4 traces each step
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
