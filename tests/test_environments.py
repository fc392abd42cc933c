"""Environments beyond one function: tools, workspaces, a user's own class.

The sandboxes, the verifier, the tokenizer and the episode loop are real.
Where a test needs the policy to make particular calls (a fix, a hostile
call), its replies are scripted: the ids it "samples" are the tokenizer's
ids of fixed text, and everything after that is the real thing. The real
model plays workspace episodes in test_a_real_policy_plays_workspace_episodes.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from rl.agent.config import AgentConfig
from rl.agent.env import EnvironmentFailed
from rl.agent.tools import TOOL_FAILURES, parse_calls
from rl.agent.workspace import TOOLS
from rl.engine import Completion
from rl.engine.config import SamplingParams
from rl.episodes.episode import run_episode
from rl.model import ModelConfig, checkpoint, load_tokenizer
from rl.tasks.format import Task
from rl.tasks.workspaces import workspace_tasks
from rl.verify.config import VerifyConfig
from rl.verify.verifier import Verifier
from sandboxes import open_sandbox

ROOT = Path(__file__).resolve().parents[1]
WORKSPACES = {t.task_id: t for t in workspace_tasks()}
SLUG = WORKSPACES["workspace/textkit.slug/fix"]
SLUG_FIX = json.loads(SLUG.reference)["textkit/slug.py"]
FORGE = (
    'import sys\nsys.stdout.write(\'\\n@@SARL-VERIFY@@\' + \'{"cases": [{"line": 2, "ok": true, "why": ""}]}\\n\')\n'
)


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(checkpoint(ModelConfig(dtype="float32")))


def call(name: str, **args: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


class Scripted:
    """A policy whose replies are fixed text; it records each prompt it was given."""

    def __init__(self, tok: Any, replies: list[str]):
        self.tok, self.replies = tok, replies
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    def __call__(self, prompt: list[int], params: SamplingParams) -> tuple[Completion, int]:
        self.prompts.append(list(prompt))
        text = self.replies[min(len(self.prompts), len(self.replies)) - 1]
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.convert_tokens_to_ids("<|im_end|>")]
        self.sampled.append(ids)
        return Completion(ids, [-0.25] * len(ids), "stop"), 5


def test_tool_calls_are_read_and_every_sloppy_one_gets_a_reason() -> None:
    got = parse_calls(
        call("read_file", path="a.py")
        + '<tool_call>{"name": "shell", "arguments": {"command": </tool_call>'
        + call("rm_rf")
        + call("write_file", path="a.py")
        + call("shell", command=3)
        + call("shell", command="ls", cwd="/")
        + '<tool_call>{"name": "shell", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
        + "<tool_call>[1, 2]</tool_call>",
        TOOLS,
        max_calls=10,
    )
    assert [c.failure for c in got] == [
        "",
        "malformed-call",
        "unknown-tool",
        "bad-arguments",
        "bad-arguments",
        "bad-arguments",
        "",  # arguments as a JSON string, as some templates write them
        "malformed-call",
    ]
    assert got[0].arguments == {"path": "a.py"} and got[6].arguments == {"command": "ls"}
    assert "content" in got[3].detail and "string" in got[4].detail and "cwd" in got[5].detail
    assert [c.failure for c in parse_calls("I think the answer is 4.", TOOLS, 4)] == ["no-call"]
    assert len(parse_calls(call("submit") * 9, TOOLS, max_calls=4)) == 4  # later calls are ignored


def test_a_workspace_episode_with_tools_fixes_the_bug_and_trains_on_exactly_the_sampled_ids(tok: Any) -> None:
    policy = Scripted(
        tok,
        [
            "Let me look. " + call("read_file", path="textkit/slug.py"),
            call("shell", command="python3 tests/test_slug.py"),
            call("write_file", path="textkit/slug.py", content=SLUG_FIX),
            call("shell", command="python3 tests/test_slug.py"),
            call("submit"),
        ],
    )
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = run_episode(SLUG, AgentConfig(max_turns=8), policy, tok, sb, verifier, 4096, seed=1)
    assert ep.end == "submitted" and ep.turns == 5 and ep.tool_calls == 5 and not ep.tool_failures
    assert ep.verdict.passed and ep.verdict.reward == 1.0
    assert "+    return '-'.join(re.findall" in ep.completion  # the answer as a diff of the work dir
    a = ep.trajectory.arrays()
    mask = a["loss_mask"] == 1
    assert a["tokens"][mask].tolist() == [t for ids in policy.sampled for t in ids]  # trained ids == sampled ids
    assert set(a["versions"][mask].tolist()) == {5} and set(a["versions"][~mask].tolist()) == {-1}
    tokens = a["tokens"].tolist()
    for prompt, ids in zip(policy.prompts, policy.sampled, strict=True):  # each turn extends what was sampled
        assert tokens[: len(prompt)] == prompt and tokens[len(prompt) : len(prompt) + len(ids)] == ids
    context = tok.decode(a["tokens"][~mask])
    assert "FAIL test_slugify_2" in context and "PASS test_slugify_3" in context  # the tools' results, masked
    assert "<tool_call>" in context  # the tools are described in the system message (no tools in this template)


def test_a_failing_visible_test_says_what_the_call_returned_and_what_it_should(tmp_path: Path) -> None:
    """The visible tests run as `python3 tests/test_x.py`, without pytest's
    assertion rewriting: each test's own message carries the two values, so
    a failing run shows the agent what to change, as pytest would."""

    env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}  # a planted bug may depend on set order

    def run(work: Path, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], cwd=work, env=env, capture_output=True, text=True, timeout=60)

    seen = 0
    for task in (t for t in WORKSPACES.values() if not t.task_id.endswith("/implement")):
        work = tmp_path / task.task_id.replace("/", "_")
        for rel, text in task.files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        test = next(p for p in task.files if p.startswith("tests/test_"))
        out = run(work, test)
        fails = [line for line in out.stdout.splitlines() if line.startswith("FAIL ")]
        assert out.returncode == 1 and fails, (task.task_id, out.stdout, out.stderr)
        for line in fails:
            name, src = line.split()[1], task.files[test]
            line_src = src[src.index(f"def {name}():") :].splitlines()[1].strip()  # got, want = f(ARGS), WANT
            call_node, want_node = ast.parse(line_src).body[0].value.elts  # type: ignore[attr-defined]
            probe = (
                f"from {task.entry_point} import *\n"
                f"try:\n print('AssertionError: returned', repr({ast.unparse(call_node)}), end='')\n"
                "except Exception as e:\n print(f'{type(e).__name__}: {e}', end='')"
            )
            said = run(work, "-c", probe).stdout
            if said.startswith("AssertionError"):
                said += f", expected {ast.literal_eval(want_node)!r}"
            assert line == f"FAIL {name} {said}", line
            seen += 1
    assert seen >= len(WORKSPACES) // 3


def test_edit_file_changes_the_one_place_old_is_and_refuses_a_missing_ambiguous_or_no_op_one(tok: Any) -> None:
    """An edit that would leave the file as it was is refused, and a write of
    what a file holds says so: neither may read as a change to the agent."""
    body = SLUG.files["textkit/slug.py"]
    line = next(x + "\n" for x in body.splitlines() if x.strip().startswith("return"))
    fix = SLUG_FIX[SLUG_FIX.index('"""\n') + 4 :]  # the fixed body, below the docstring the edit leaves alone
    policy = Scripted(
        tok,
        [
            call("edit_file", path="textkit/slug.py", old="    return nothing\n", new="x"),
            call("edit_file", path="textkit/slug.py", old="e", new="x"),
            call("edit_file", path="textkit/slug.py", old="", new="x"),
            call("edit_file", path="textkit/nope.py", old="a", new="b"),
            call("edit_file", path="../slug.py", old="a", new="b"),
            call("edit_file", path="textkit/slug.py", old=line, new=line),
            call("write_file", path="textkit/slug.py", content=body),
            call("edit_file", path="textkit/slug.py", old=line, new=fix),
            call("shell", command="python3 tests/test_slug.py") + call("submit"),
        ],
    )
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = run_episode(SLUG, AgentConfig(max_turns=10), policy, tok, sb, verifier, 8192, seed=1)
    assert ep.end == "submitted" and ep.verdict.passed, ep.verdict
    # missing, ambiguous, empty, on a file not there, a no-op: each a valid call the tool answered with an error
    assert dict(ep.tool_failures) == {"outside-workspace": 1, "tool-error": 5}
    context = tok.decode(np.asarray(ep.trajectory.tokens)[np.asarray(ep.trajectory.loss_mask) == 0])
    assert context.count("not written: the old text is not in the file") == 2  # a line it lacks, and ""
    assert "the old text is in the file" in context and "times: give more of its lines" in context
    assert "textkit/nope.py: not written: no such file" in context and "edited textkit/slug.py" in context
    assert "textkit/slug.py: not written: the new text is the old text: the file is unchanged" in context
    assert f"wrote {len(body)} characters to textkit/slug.py: the same as it held, unchanged" in context
    assert context.count("edited textkit/slug.py") == 1  # the fix alone
    assert "FAIL" not in context.rsplit("edited textkit/slug.py", 1)[1]  # after the edit, every visible test passes


def test_hostile_and_sloppy_tool_calls_become_observations_with_their_reasons(tok: Any) -> None:
    policy = Scripted(
        tok,
        [
            '<tool_call>{"name": "shell", "arguments": {"command": </tool_call>' + call("nope"),
            call("write_file", path="textkit") + "no call here either",
            "I will not call a tool.",
            call("shell", command="python3 -c \"print('x' * 200000)\""),
            call("shell", command="sleep 60"),
            call("write_file", path="../../etc/passwd", content="x")
            + call("write_file", path="/etc/hosts", content="x")
            + call("read_file", path="/etc/shadow"),
            call("shell", command="ln -s /etc link") + call("write_file", path="link/evil", content="x"),
            call("write_file", path="textkit/slug.py", content=SLUG_FIX) + call("submit"),
        ],
    )
    cfg = AgentConfig(max_turns=10, run_s=1.0, observation_tokens=200)
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = run_episode(SLUG, cfg, policy, tok, sb, verifier, 8192, seed=1)
    f = ep.tool_failures
    assert f["malformed-call"] == 1 and f["unknown-tool"] == 1 and f["bad-arguments"] == 1 and f["no-call"] == 1
    assert f["output-cut"] == 1 and f["call-timeout"] == 1 and f["outside-workspace"] == 4, f
    assert set(f) <= set(TOOL_FAILURES)
    assert ep.end == "submitted" and ep.turns == 8 and ep.verdict.passed  # the episode went on to the end
    context = tok.decode(np.asarray(ep.trajectory.tokens)[np.asarray(ep.trajectory.loss_mask) == 0])
    assert "(cut)" in context and "per-call limit" in context and "outside the workspace" in context
    assert "root:" not in context  # nothing of /etc/shadow came back
    assert ep.timings["execute_s"] < 30  # the hanging command was cut at its 1 s limit


@pytest.mark.parametrize(
    ("what", "files"),
    [
        ("an edited visible test", {"tests/test_slug.py": "def test_nothing():\n    pass\n"}),
        ("a planted reward file", {"reward.txt": "1\n", "logs/verifier/reward.json": '{"reward": 1}'}),
        ("a conftest.py", {"conftest.py": "import os\nos._exit(0)\n", "tests/conftest.py": "raise SystemExit\n"}),
        ("a pytest.ini", {"pytest.ini": "[pytest]\naddopts = -p no:python\n"}),
        ("a sitecustomize.py", {"sitecustomize.py": "import os\nos._exit(0)\n", "usercustomize.py": "x = 1\n"}),
        ("a stdlib module shadowed", {"json.py": "def dumps(*a, **k):\n    return '{}'\n", "ast.py": "x = 1\n"}),
        ("a forged result line", {"textkit/forge.py": FORGE}),
    ],
)
def test_nothing_the_policy_writes_changes_the_grading(what: str, files: dict[str, str]) -> None:
    """The buggy package with each tampering still fails; the fixed one with
    the same tampering still passes: the grade is the code's."""
    buggy = {**SLUG.files, **files}
    fixed = {**buggy, "textkit/slug.py": SLUG_FIX}
    if "textkit/forge.py" in files:  # the module prints a forged result line when the grader imports it
        buggy["textkit/slug.py"] = "import textkit.forge  # noqa: F401\n" + buggy["textkit/slug.py"]
        fixed["textkit/slug.py"] = "import textkit.forge  # noqa: F401\n" + SLUG_FIX
    with Verifier(VerifyConfig(parallel=1)) as verifier:
        bad = verifier.verify(SLUG, "", final_files=buggy)
        good = verifier.verify(SLUG, "", final_files=fixed)
    assert not bad.passed and bad.reward == 0.0, (what, bad)
    assert good.passed and good.reward == 1.0, (what, good)


@pytest.mark.slow  # 12 s alone: out of the fast tier
def test_every_shipped_workspace_task_validates(tmp_path: Path) -> None:
    """Reference passes (three runs agree), the untouched files and the emptied
    fix fail, no duplicates: the 258 tasks of `sarl tasks generate --family
    workspace`, 216 of them built from generated functions."""
    from rl.tasks.workspace_functions import function_workspaces
    from rl.validation.report import validate

    tasks = list(WORKSPACES.values()) + function_workspaces()
    assert len(tasks) >= 250 and {t.metadata["family"] for t in tasks} == {
        "workspace-fix",
        "workspace-implement",
        "workspace-make-pass",
    }
    with Verifier(VerifyConfig(parallel=2)) as verifier:
        reports = validate(tasks, verifier, repeats=3)
        untouched = [verifier.verify(t, "", final_files=t.files) for t in tasks]
    assert [r.problems for r in reports if not r.ok] == []
    assert all(r.cases >= 4 for r in reports)  # a generated function has at least 4 distinct inputs
    assert all(v.reward == 0.0 and not v.passed for v in untouched)  # doing nothing earns nothing
    broken = tasks[0].model_copy(update={"reference": json.dumps({"tests/test_slug.py": "x"})})
    with Verifier(VerifyConfig(parallel=1)) as verifier:
        [report] = validate([broken], verifier, repeats=1)
    assert not report.ok and "not tests/" in report.problems[0]


# ------------------------------------------------------------ your own environment
CALC = Task(
    task_id="calc/1",
    prompt="A box holds 12 eggs. How many eggs are in 7 boxes?",
    entry_point="answer",
    tests="84",
    environment="examples.calculator_env:CalculatorEnv",
)


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_example_environment_plays_through_the_same_loop(tok: Any, on_path: Path) -> None:
    policy = Scripted(tok, [call("calc", expression="12 * 7"), call("answer", value=84)])
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = run_episode(CALC, AgentConfig(max_turns=4), policy, tok, sb, verifier, 2048, seed=0)
        assert ep.end == "submitted" and ep.verdict.reward == 1.0 and ep.verdict.passed
        assert "12 * 7 = 84" in tok.decode(policy.prompts[1])
        wrong = Scripted(tok, [call("answer", value=85)])
        ep = run_episode(CALC, AgentConfig(max_turns=4), wrong, tok, sb, verifier, 2048, seed=0)
        assert ep.verdict.reward == 0.0 and not ep.verdict.passed
    # the config names it for every task, whatever the task says
    cfg = AgentConfig(environment="examples.calculator_env:CalculatorEnv")
    assert cfg.environment.endswith(":CalculatorEnv")


def _module(folder: Path, name: str, body: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    sys.modules.pop(name, None)
    return name


@pytest.mark.parametrize(
    ("spec", "body", "words"),
    [
        ("no_such_module_xyz:Env", None, "cannot be imported"),
        ("{m}:Missing", "class Env:\n    pass\n", "has no class 'Missing'"),
        (
            "{m}:Env",
            """
            class Env:
                def __init__(self, ctx): pass
                def reset(self, task): pass
                def step(self, reply): pass
                def final(self): pass
                def verify(self, final): pass
            """,
            "Env.step must take (self, reply, last)",
        ),
        ("{m}:Env", "class Env:\n    def __init__(self, ctx):\n        pass\n", "has no method reset(task)"),
        ("{m}:Env", "raise RuntimeError('broken at import')\n", "raised RuntimeError: broken at import"),
        ("not a spec", None, "neither a built-in environment"),
    ],
)
def test_a_bad_environment_is_refused_when_the_config_is_read(
    on_path: Path, spec: str, body: str | None, words: str
) -> None:
    if body is not None:
        spec = spec.format(m=_module(on_path, f"env_{abs(hash(body)) % 10**8}", body))
    with pytest.raises(ValidationError) as e:
        AgentConfig(environment=spec)
    assert "environment" in str(e.value) and words in str(e.value), str(e.value)


def test_a_submit_with_a_bad_environment_submits_nothing(workdir: Path) -> None:
    from conftest import run_config, sarl, write_config

    agent = {"environment": "nosuch_env_mod:Env"}
    cfg = write_config(workdir, run_config("badenv", rollout={"tasks_file": "t.jsonl", "agent": agent}))
    out = sarl("submit", str(cfg), "--cluster", "local", cwd=workdir, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "rollout.agent.environment" in out.stderr and "nosuch_env_mod" in out.stderr
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize(
    ("method", "body", "words"),
    [
        ("step", "def step(self, reply, last):\n        return 1 / 0\n", "step raised ZeroDivisionError"),
        ("verify", "def verify(self, final):\n        return {'tests': 2.0}\n", "a number in [0, 1]"),
        ("verify", "def verify(self, final):\n        return {'vibes': 1.0}\n", "unknown check"),
        ("final", "def final(self):\n        return 'answer'\n", "not a Final"),
    ],
)
def test_an_environment_that_fails_is_an_infrastructure_failure_not_a_reward(
    tok: Any, on_path: Path, method: str, body: str, words: str
) -> None:
    """An environment's error never becomes a reward of 0 to train on: the
    episode raises EnvironmentFailed, which the rollout worker records as
    the group's reason for being given up (rl.rollout.worker)."""
    name = _module(
        on_path,
        f"failing_env_{method}_{abs(hash(body)) % 10**6}",
        "from examples.calculator_env import CalculatorEnv\n\n\nclass Env(CalculatorEnv):\n    " + body,
    )
    task = CALC.model_copy(update={"environment": f"{name}:Env"})
    policy = Scripted(tok, [call("answer", value=84)])
    with (
        open_sandbox() as sb,
        Verifier(VerifyConfig(parallel=1)) as verifier,
        pytest.raises(EnvironmentFailed) as e,
    ):
        run_episode(task, AgentConfig(max_turns=2), policy, tok, sb, verifier, 2048, seed=0)
    assert words in str(e.value), str(e.value)


@pytest.mark.slow
def test_a_real_policy_plays_workspace_episodes(tok: Any) -> None:
    """SmolLM2 itself (HF engine) on two workspace tasks: whatever it writes,
    the episode runs to its end, every reply is read as calls or a reason,
    and the trained ids are exactly the sampled ones."""
    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig

    engine = make_engine(HFEngineConfig(max_model_len=4096), ModelConfig(dtype="float32"))
    sampled: list[list[int]] = []

    def generate(prompt: list[int], params: SamplingParams) -> tuple[Any, int]:
        [[c]] = engine.generate([prompt], params)
        sampled.append(list(c.token_ids))
        return c, 2

    cfg = AgentConfig(max_turns=3, max_tokens=96, temperature=1.0)
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        for k, tid in enumerate(["workspace/numkit.stats/fix", "workspace/roman.numerals/implement"]):
            sampled.clear()
            ep = run_episode(WORKSPACES[tid], cfg, generate, tok, sb, verifier, 4096, seed=10 + k)
            sb.reset()
            a = ep.trajectory.arrays()
            assert a["tokens"][a["loss_mask"] == 1].tolist() == [t for ids in sampled for t in ids]
            assert ep.turns == len(sampled) and ep.end in ("submitted", "max-turns", "token-budget")
            assert ep.tool_calls >= ep.turns and sum(ep.tool_failures.values()) <= ep.tool_calls
            assert ep.verdict is not None and 0.0 <= ep.verdict.reward <= 1.0


# ------------------------------------------------------------------ SQL
def test_an_sql_episode_explores_read_only_then_is_graded_on_the_rows_of_its_answer(tok: Any) -> None:
    from rl.tasks.sql import sql_tasks

    tasks = {t.task_id: t for t in sql_tasks()}
    task = next(t for t in tasks.values() if t.metadata["template"] == "sql/shop/buyers-of")
    category = task.task_id.rsplit("/", 1)[1]
    same_rows = (  # another query with the same rows, in another order, with other column names
        "SELECT c.name AS who FROM customers c WHERE c.id IN (SELECT o.customer_id FROM orders o JOIN products p "
        f"ON p.id = o.product_id WHERE p.category = '{category}') GROUP BY c.name ORDER BY c.name DESC"
    )
    policy = Scripted(
        tok,
        [
            call("sql", query="SELECT name FROM sqlite_master WHERE type = 'table'"),
            call("sql", query="DELETE FROM orders") + call("sql", query="ATTACH DATABASE '/sandbox/x.db' AS x"),
            call("sql", query="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"),
            call("sql", query="SELECT * FROM orders"),
            call("answer", query=same_rows),
        ],
    )
    cfg = AgentConfig(max_turns=6, run_s=5.0, observation_tokens=256)
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = run_episode(task, cfg, policy, tok, sb, verifier, 8192, seed=0)
        seen = [tok.decode(p) for p in policy.prompts]
        assert "customers" in seen[1] and "orders" in seen[1]  # the tables were listed
        assert seen[2].count("not authorized") == 2  # no change, no attached file
        assert "ran past its time limit" in seen[3]
        assert "more than 20 rows" in seen[4]
        assert ep.end == "submitted" and ep.verdict.passed and ep.verdict.reward == 1.0, ep.verdict
        assert ep.tool_failures["call-timeout"] == 1
        assert ep.tool_failures["tool-error"] == 2  # the two refused statements: answered with an error
        wrong = verifier.verify(task, "SELECT name FROM customers")
        assert not wrong.passed and wrong.reward == 0.0 and "rows" in wrong.failure
        ordered = next(t for t in tasks.values() if t.metadata["template"] == "sql/shop/top-price")
        flipped = f"SELECT * FROM ({ordered.reference}) ORDER BY price ASC"
        assert verifier.verify(ordered, ordered.reference).passed
        assert not verifier.verify(ordered, flipped).passed  # the question asks for an order: it counts
        assert not verifier.verify(task, "SELECT 1; DROP TABLE customers").passed


@pytest.mark.slow  # 100 s alone: out of the fast tier
def test_every_shipped_sql_task_validates() -> None:
    """360 questions over 9 databases at 3 levels, at least 30 over each, so
    that whole databases can be held out: the reference passes three times
    alike, no answer that knows nothing of the data passes, no duplicates."""
    from collections import Counter

    from rl.tasks.sql import sql_tasks
    from rl.validation.report import validate

    tasks = sql_tasks()
    assert len(tasks) >= 300
    assert Counter(t.metadata["difficulty"] for t in tasks).keys() == {1, 2, 3}
    per_database = Counter(t.metadata["family"] for t in tasks)
    assert len(per_database) == 9 and min(per_database.values()) >= 30, per_database
    with Verifier(VerifyConfig(parallel=2)) as verifier:
        reports = validate(tasks, verifier, repeats=2)
    assert [r.problems for r in reports if not r.ok] == []


# ------------------------------------------------------------------ Node.js
def test_a_javascript_episode_sees_its_failed_example_and_fixes_it(tok: Any) -> None:
    from rl.tasks.node import node_tasks

    task = next(t for t in node_tasks() if t.entry_point == "truncate")
    wrong = "```javascript\nfunction truncate(text, width) {\n  return text.slice(0, width) + '...';\n}\n```"
    right = "Fixed:\n```js\n" + task.reference + "```"
    policy = Scripted(tok, [wrong, right])
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = run_episode(task, AgentConfig(max_turns=3), policy, tok, sb, verifier, 2048, seed=0)
    shown = tok.decode(policy.prompts[1])
    assert "Examples: 0 of 3 passed." in shown and 'truncate("hello", 5): expected "hello"' in shown
    assert ep.end == "examples-pass" and ep.turns == 2 and ep.verdict.passed and ep.verdict.reward == 1.0
    a = ep.trajectory.arrays()
    assert a["tokens"][a["loss_mask"] == 1].tolist() == [t for ids in policy.sampled for t in ids]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("process.exit(0);", "the node process ended"),
        ("while (true) {}", "timeout"),
        ("require('fs').writeSync(3, JSON.stringify({i: 0, ok: 'x'}) + '\\n'); return 0;", "wrong value"),
        ("console.log('\\n@@SARL-NODE@@{\"cases\": []}'); return null;", "wrong value"),
        ("return require('child_process').execSync('echo hi').toString();", "wrong value"),
        ("throw new Error('no');", "Error"),
    ],
)
def test_hostile_javascript_earns_nothing_and_the_verifier_holds(body: str, why: str) -> None:
    from rl.tasks.node import node_tasks, stub

    task = next(t for t in node_tasks() if t.entry_point == "slugify")
    with Verifier(VerifyConfig(parallel=1)) as verifier:
        v = verifier.verify(task, stub(task, body))
    assert not v.passed and v.reward == 0.0 and why in v.failure, v


@pytest.mark.slow  # 12 s alone: out of the fast tier
def test_every_shipped_javascript_task_validates_and_a_missing_runtime_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rl.tasks.node import node_tasks
    from rl.validation.report import validate
    from rl.verify import verifier as verifier_module

    tasks = node_tasks()
    assert len(tasks) >= 14 and all(t.runtime == "node" for t in tasks)
    with Verifier(VerifyConfig(parallel=2)) as verifier:
        reports = validate(tasks, verifier, repeats=2)
    assert [r.problems for r in reports if not r.ok] == []
    monkeypatch.setitem(verifier_module.RUNTIME_PROBES, "node", ["nodejs-that-is-not-installed", "--version"])
    with Verifier(VerifyConfig(parallel=1)) as verifier:
        [report] = validate(tasks[:1], verifier, repeats=1)
    assert not report.ok and "runtime 'node'" in report.problems[0], report


# ------------------------------------------------------------------ Harbor
HARBOR = ROOT / "tests" / "fixtures" / "harbor"
HARBOR_OK = ["hello-file", "fix-csv-total", "word-count"]


def test_harbor_directories_import_validate_and_carry_an_apptainer_definition() -> None:
    from rl.tasks.harbor import import_harbor
    from rl.validation.report import validate

    tasks = [import_harbor(HARBOR / name) for name in HARBOR_OK]
    fix = tasks[1]
    assert (
        fix.files.keys() == {"total.py", "sales.csv"} and "/app" not in fix.prompt and "/sandbox/total.py" in fix.prompt
    )
    assert json.loads(fix.tests).keys() == {"test.sh", "check.py"} and "total.py" not in fix.tests.split("check.py")[0]
    assert tasks[2].files.keys() == {"data/poem.txt"}  # COPY data /app/data: the folder's files, under data/
    assert all("Bootstrap: docker" in t.metadata["harbor"]["apptainer_def"] for t in tasks)
    assert "From: debian:bookworm-slim" in tasks[2].metadata["harbor"]["apptainer_def"]
    with Verifier(VerifyConfig(parallel=2)) as verifier:
        reports = validate(tasks, verifier, repeats=2)  # the oracle passes twice; the untouched work dir does not
        assert [r.problems for r in reports if not r.ok] == []
        partial = {**fix.files, "total.py": fix.files["total.py"].replace("rows[1:]", "rows[2:]")}
        v = verifier.verify(fix, "", final_files=partial)  # reward.json: a share of its cases
        assert not v.passed and v.reward == 0.0 and "reward 0.0" in v.failure
        planted = {**fix.files, "reward.txt": "1\n", "logs/verifier/reward.txt": "1\n", "tests/test.sh": "exit 0\n"}
        assert verifier.verify(fix, "", final_files=planted).reward == 0.0  # the work dir cannot grade itself


def test_a_harbor_directory_the_sandbox_cannot_meet_is_refused_naming_the_line(workdir: Path) -> None:
    from conftest import sarl

    out = sarl("tasks", "import", "harbor", str(HARBOR), "-o", "all.jsonl", cwd=workdir, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "needs-a-build-step/environment/Dockerfile:3" in out.stderr and "RUN" in out.stderr
    assert not (workdir / "all.jsonl").exists()  # nothing written: the good directories neither
    ok = sarl("tasks", "import", "harbor", *(str(HARBOR / n) for n in HARBOR_OK), "-o", "ok.jsonl", cwd=workdir)
    assert ok.returncode == 0 and len((workdir / "ok.jsonl").read_text().splitlines()) == 3


def test_a_harbor_task_is_played_with_the_workspace_tools(tok: Any) -> None:
    from rl.tasks.harbor import import_harbor

    task = import_harbor(HARBOR / "word-count")
    policy = Scripted(
        tok,
        [
            call("shell", command="ls -R /sandbox && wc -w /sandbox/data/poem.txt"),
            call("write_file", path="count.sh", content='#!/bin/bash\nwc -w < "$1"\n') + call("submit"),
        ],
    )
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = run_episode(task, AgentConfig(max_turns=4), policy, tok, sb, verifier, 4096, seed=0)
    assert "12 /sandbox/data/poem.txt" in tok.decode(policy.prompts[1])
    assert ep.end == "submitted" and ep.verdict.passed and ep.verdict.reward == 1.0, ep.verdict


@pytest.mark.parametrize(
    ("text", "name", "reward"),
    [
        ("1\n", "reward.txt", 1.0),
        ("0.25", "reward.txt", 0.25),
        ("7", "reward.txt", 1.0),  # clamped
        ("yes", "reward.txt", None),
        ('{"reward": 0.5, "cases": 3}', "reward.json", 0.5),
        ('{"a": 1, "b": 0}', "reward.json", 0.5),
        ('{"reward": "high"}', "reward.json", None),
        ("[1]", "reward.json", None),
    ],
)
def test_the_reward_file_a_harbor_test_writes_is_read_as_harbor_defines_it(
    text: str, name: str, reward: float | None
) -> None:
    from rl.tasks.harbor import harbor_reward

    assert harbor_reward(text, name) == reward


# ------------------------------------------------ a chat template that renders tools
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n"
    "{% endif %}# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{%- for m in messages %}{%- if not (tools and loop.first and m['role'] == 'system') %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_with_tools_gets_the_declarations_and_tool_messages_with_ids_still_exact() -> None:
    """SmolLM2's tokenizer with a Qwen-style template that renders `tools`:
    the declarations go to the template (not the text protocol), results come
    back as `tool` messages, and the trajectory is, id for id, what the
    template gives for the whole conversation."""
    from rl.agent.tools import template_has_tools
    from rl.model import chat_ids

    tok = load_tokenizer(checkpoint(ModelConfig(dtype="float32")))
    tok.chat_template = TOOL_TEMPLATE
    assert template_has_tools(tok)
    replies = [call("read_file", path="textkit/slug.py"), call("write_file", path="textkit/slug.py", content=SLUG_FIX)]
    policy = Scripted(tok, [*replies, call("submit")])
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        ep = run_episode(SLUG, AgentConfig(max_turns=4), policy, tok, sb, verifier, 4096, seed=0)
    assert ep.verdict.passed and ep.end == "submitted"
    first = tok.decode(policy.prompts[0])
    assert '"name": "write_file"' in first and "<tools>" in first and "You can use these tools" not in first
    assert "<|im_start|>tool\n[read_file] textkit/slug.py:" in tok.decode(policy.prompts[1])
    # the whole conversation, rendered at once, is the same ids: nothing was re-tokenised differently
    from rl.agent.workspace import SYSTEM_PROMPT, TOOLS, first_message

    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": first_message(SLUG)}]
    context = [
        tok.decode(p[len(q) + len(s) :])
        for p, q, s in zip(policy.prompts[1:], policy.prompts, policy.sampled, strict=False)
    ]
    for reply, obs in zip(replies, context, strict=True):
        body = obs.split("<|im_start|>tool\n", 1)[1].rsplit("<|im_end|>", 1)[0]
        messages += [{"role": "assistant", "content": reply}, {"role": "tool", "content": body}]
    whole = chat_ids(tok, messages, tools=[t.schema() for t in TOOLS])
    assert policy.prompts[2] == whole


def test_a_rollout_worker_gives_up_a_group_whose_environment_fails_and_trains_on_none_of_it(
    tmp_path: Path, tiny_model: Path, on_path: Path
) -> None:
    """A real rollout worker (tiny model, HF engine, real sandboxes): the
    group whose environment raises in `step` is given up with the reason in
    the store's given-up record; the other group is committed; no sample of
    the failing task reaches the store."""
    from conftest import hf_worker

    from rl.engine import make_engine
    from rl.rollout.loop import play
    from rl.serving.inprocess import serving
    from rl.tasks.format import write_tasks

    name = _module(
        on_path,
        "failing_step_env",
        "from examples.calculator_env import CalculatorEnv\n\n\nclass Env(CalculatorEnv):\n"
        "    def step(self, reply, last):\n        raise KeyError('the grader is down')\n",
    )
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks(tasks_file, [CALC, CALC.model_copy(update={"task_id": "calc/broken", "environment": f"{name}:Env"})])
    rollout = {"groups": 2, "group_size": 2, "concurrency": 4, "max_retries": 0,
               "agent": {"max_turns": 2, "max_tokens": 8}}  # fmt: skip
    worker, cfg, state = hf_worker(tmp_path, "envfail", tasks_file, tiny_model, rollout)
    engine = make_engine(cfg.generator.engine, cfg.model)
    try:
        with serving(engine, cfg.run_dir):
            play(worker)
    finally:
        engine.close()
    reader = worker.store.reader()
    samples = [s for k in reader.committed() for s in reader.read(k).samples()]
    assert {s.task_id for s in samples} == {"calc/1"} and len(samples) == 2
    reasons = list(worker.abandoned.values())
    assert len(reasons) == 1 and reasons[0].startswith("environment: ") and "KeyError" in reasons[0], reasons
    assert worker.store.given_up.count() == 1


@pytest.mark.parametrize(
    ("dockerfile", "words"),
    [
        ("FROM python:3.11\nWORKDIR /app\nENV X=1\n", ":3: 'ENV X=1'"),
        (
            "FROM python:3.11\nWORKDIR /app\nCOPY a.txt /etc/a.txt\n",
            ":3: 'COPY a.txt /etc/a.txt': the sandbox runtime holds only",
        ),
        ("FROM python:3.11\nCOPY a.txt a.txt\n", "holds only the WORKDIR (none set)"),
        ("FROM python:3.11\n# a comment\n\nWORKDIR /app\nRUN pip install \\\n  numpy\n", ":5: 'RUN pip install"),
        ("FROM python:3.11\nWORKDIR /app\nCOPY missing.txt /app/\n", "COPY missing.txt: no such file"),
    ],
)
def test_a_dockerfile_line_the_sandbox_cannot_meet_is_named(tmp_path: Path, dockerfile: str, words: str) -> None:
    import shutil

    from rl.tasks.format import TaskError
    from rl.tasks.harbor import import_harbor

    d = tmp_path / "t"
    shutil.copytree(HARBOR / "hello-file", d)
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "environment" / "a.txt").write_text("a\n")
    with pytest.raises(TaskError) as e:
        import_harbor(d)
    assert words in str(e.value), str(e.value)


def test_a_dockerfile_the_sandbox_can_meet_gives_the_work_dir_docker_would(tmp_path: Path) -> None:
    import shutil

    from rl.tasks.harbor import import_harbor

    d = tmp_path / "t"
    shutil.copytree(HARBOR / "hello-file", d)
    env = d / "environment"
    (env / "src" / "pkg").mkdir(parents=True)
    (env / "src" / "pkg" / "m.py").write_text("x = 1\n")
    (env / "a.txt").write_text("a\n")
    (env / "Dockerfile").write_text(
        "FROM python:3.11-slim AS base\nLABEL x=y\nWORKDIR /app\nCOPY src/ /app/code\nCOPY a.txt ./notes/\n"
        'ADD a.txt /app/b.txt\nCMD ["bash"]\n'
    )
    task = import_harbor(d)
    assert task.files.keys() == {"code/pkg/m.py", "notes/a.txt", "b.txt"}, task.files.keys()


def test_doing_nothing_scores_zero_however_many_verifications_of_the_task_run_at_once() -> None:
    """The floor of a workspace task (the best of a constant answer and of the
    untouched files) is stored whole: a group's episodes verified at once all
    read it complete. (Storing the constants' floor first let a concurrent
    verification score the untouched files of datekit.calendar/make-pass 0.33.)"""
    task = WORKSPACES["workspace/datekit.calendar/make-pass"]
    with Verifier(VerifyConfig(parallel=4)) as verifier:
        verdicts = verifier.verify_many([(task, "", dict(task.files))] * 8)
    assert [v.reward for v in verdicts] == [0.0] * 8
