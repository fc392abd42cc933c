"""The agent: actions parsed from sloppy replies, visible examples, and
multi-turn trajectories whose trained ids are exactly the sampled ones
(real SmolLM2, real HF engine, real sandboxes, real verifier)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rl.agent.actions import parse_action
from rl.agent.config import AgentConfig
from rl.agent.observe import describe, run_action
from rl.agent.tokens import ObservationTokens
from rl.engine.config import HFEngineConfig, SamplingParams
from rl.episodes.episode import run_episode
from rl.model import ModelConfig, chat_ids, checkpoint, load_tokenizer
from rl.store import Sample, Store
from rl.tasks.importers import doctest_examples, import_humaneval
from rl.verify.config import VerifyConfig
from rl.verify.verifier import Verifier
from sandboxes import open_sandbox

HUMANEVAL = {t.task_id: t for t in import_humaneval()}


@pytest.mark.parametrize(
    ("reply", "code", "how"),
    [
        ("Here:\n```python\ndef f(x):\n    return x\n```\nDone.", "def f(x):\n    return x", "python-block"),
        (
            "```\ndef f():\n    return 1\n```\n```py\ndef f():\n    return 2\n```",
            "def f():\n    return 2",
            "python-block",
        ),
        ("```\ndef f():\n    return 1\n```", "def f():\n    return 1", "block"),
        ("Sure! ```python\ndef f():\n    return 3\n", "def f():\n    return 3", "open-fence"),
        ("def f():\n    return 4\nThis returns four.", "def f():\n    return 4", "bare-code"),
        ("I cannot help with that.", "", "none"),
    ],
)
def test_actions_are_found_in_sloppy_replies(reply: str, code: str, how: str) -> None:
    a = parse_action(reply)
    assert (a.code, a.how) == (code, how)


def test_visible_examples_come_from_the_prompt_never_the_tests() -> None:
    t0 = HUMANEVAL["HumanEval/0"]
    assert [(e.call, e.expected) for e in t0.examples] == [
        ("has_close_elements([1.0, 2.0, 3.0], 0.5)", "False"),
        ("has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)", "True"),
    ]
    arrows = doctest_examples('def f(s):\n    """\n    f("ab") ➞ 2\n    f("") == 0\n    f(x) = y\n    """\n', "f")
    assert [(e.call, e.expected) for e in arrows] == [('f("ab")', "2"), ('f("")', "0")]
    for t in HUMANEVAL.values():  # no hidden-test assertion leaks into the examples
        assert all(e.call not in t.tests or e.call in t.prompt for e in t.examples), t.task_id


def test_examples_run_in_the_episode_sandbox_and_failures_are_shown() -> None:
    t0 = HUMANEVAL["HumanEval/0"]
    right = "def has_close_elements(numbers, threshold):\n" + t0.reference
    with open_sandbox() as sb:
        good = run_action(sb, t0, right, 5.0)
        bad = run_action(sb, t0, "def has_close_elements(numbers, threshold):\n    print('hi')\n    return True\n", 5.0)
        crash = run_action(sb, t0, "def has_close_elements(:\n", 5.0)
        hang = run_action(sb, t0, "while True:\n    pass\n", 1.0)
    assert good.all_pass and len(good.examples) == 2
    assert not bad.all_pass and bad.stdout == "hi\nhi\n" and [x[3] for x in bad.examples] == [False, True]
    text = describe(bad, True)
    assert "Examples: 1 of 2 passed." in text and "expected False, got True" in text and "Output:\nhi\nhi" in text
    assert not crash.loaded and "SyntaxError" in describe(crash, True)
    assert hang.limit == "wall_time" and "wall time limit" in describe(hang, True)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(checkpoint(ModelConfig(dtype="float32")))


def test_observation_ids_continue_the_template_without_retokenising(tok: Any) -> None:
    obs = ObservationTokens(tok)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    prompt = chat_ids(tok, msgs)
    reply = "```python\ndef f():\n    return 1\n```"
    sampled = tok.encode(reply, add_special_tokens=False) + [obs.end_id]
    ids = prompt + sampled + obs.after_reply(sampled, "Examples: 0 of 1 passed.")
    full = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Examples: 0 of 1 passed."}]
    assert ids == chat_ids(tok, full)  # the same ids the template gives for the whole conversation
    cut = tok.encode("def f(", add_special_tokens=False)  # a reply cut by the token limit: end of turn added
    assert obs.after_reply(cut, "x")[0] == obs.end_id


@pytest.mark.slow
def test_multi_turn_episodes_train_on_exactly_the_sampled_ids(tok: Any, tmp_path: Path) -> None:
    from rl.engine import make_engine

    engine = make_engine(HFEngineConfig(max_model_len=2048), ModelConfig(dtype="float32"))
    sampled: list[tuple[list[int], list[float]]] = []

    def generate(prompt: list[int], params: SamplingParams) -> tuple[Any, int]:
        [[c]] = engine.generate([prompt], params)
        sampled.append((list(c.token_ids), list(c.logprobs)))
        return c, 7  # the version this test says served it

    cfg = AgentConfig(max_turns=2, max_tokens=80, temperature=0.9, stop_when_examples_pass=True)
    episodes = []
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        for k, tid in enumerate(["HumanEval/0", "HumanEval/2", "HumanEval/29"]):
            sampled.clear()
            ep = run_episode(HUMANEVAL[tid], cfg, generate, tok, sb, verifier, max_model_len=2048, seed=100 + k)
            sb.reset()
            episodes.append((ep, list(sampled)))
    assert any(ep.turns >= 2 for ep, _ in episodes), [(ep.turns, ep.end) for ep, _ in episodes]
    rows = []
    for i, (ep, calls) in enumerate(episodes):
        a = ep.trajectory.arrays()
        mask = a["loss_mask"] == 1
        assert a["tokens"][mask].tolist() == [t for ids, _ in calls for t in ids]  # trained ids == sampled ids
        assert np.allclose(a["logprobs"][mask], [lp for _, lps in calls for lp in lps])
        assert set(a["versions"][mask].tolist()) == {7} and set(a["versions"][~mask].tolist()) == {-1}
        assert ep.turns == len(calls) and ep.end in ("examples-pass", "max-turns", "token-budget")
        assert ep.verdict is not None and 0.0 <= ep.verdict.reward <= 1.0
        rows.append(
            Sample(
                task_id=f"{i}",
                group_id=i,
                policy_version=7,
                tokens=a["tokens"],
                loss_mask=a["loss_mask"],
                logprobs=a["logprobs"],
                reward=ep.verdict.reward,
                checks=ep.verdict.sample_checks(),
                timings=ep.timings,
                versions=a["versions"],
            )
        )
    store = Store(tmp_path)
    store.writer("w0").write(0, rows)
    back = store.reader().read(("w0", 0)).samples()
    for row, got in zip(rows, back, strict=True):  # what the learner reads is what was sampled
        assert np.array_equal(got.tokens, row.tokens) and np.array_equal(got.loss_mask, row.loss_mask)
        assert np.array_equal(got.versions, row.versions) and np.array_equal(got.logprobs, row.logprobs)


@pytest.mark.slow  # 14 s alone: out of the fast tier
def test_a_hanging_solution_is_cut_by_the_episode_deadline(tok: Any) -> None:
    """A scripted policy (its replies are fixed; the sandbox, the run and the
    verifier are real) writes code that never returns."""
    from rl.engine import Completion
    from rl.episodes.samples import failure_of

    reply = "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
    ids = tok.encode(reply, add_special_tokens=False)

    def generate(prompt: list[int], params: SamplingParams) -> tuple[Any, int]:
        return Completion(ids, [-0.5] * len(ids), "stop"), 0

    cfg = AgentConfig(max_turns=4, run_s=60.0)  # each run may take a minute; the episode may take 3 s
    with open_sandbox() as sb, Verifier(VerifyConfig(parallel=1)) as verifier:
        t0 = time.monotonic()
        ep = run_episode(HUMANEVAL["HumanEval/0"], cfg, generate, tok, sb, verifier, 2048, deadline=t0 + 3.0)
        played = ep.timings["generate_s"] + ep.timings["execute_s"]
    assert ep.end == "deadline" and failure_of(ep) == "deadline"
    assert ep.turns == 1 and played < 6.0, ep.timings  # cut at the deadline, not after the run's own minute
    assert ep.verdict is not None and not ep.verdict.passed  # still verified, and scored as a policy failure


def test_a_repair_trace_shows_what_the_agent_would_have_shown_and_trains_the_fix_alone(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Generated tasks carry a wrong first attempt (rl.tasks.repairs). Run in
    a real sandbox by the agent's own runner, each attempt fails a visible
    example, and the agent's observation of it is, to the character, the one
    the warm start shows. A repair sample holds the prompt, the attempt and
    the observation as context (mask 0) and trains the reference alone."""
    from rl.learner.references import References, reference_reply, repair_observation
    from rl.tasks.format import write_tasks
    from rl.tasks.synthesis import synthesize

    tasks = [t for t in synthesize("all", 39, seed=4) if "repair" in t.metadata]
    assert len(tasks) >= 20  # most generated tasks have one
    picked = tasks[::3][:8]
    with open_sandbox() as sb:
        for t in picked:
            outcome = run_action(sb, t, t.metadata["repair"]["attempt"], 5.0)
            assert outcome.loaded and not outcome.all_pass, t.task_id
            assert describe(outcome, True) == repair_observation(t), t.task_id
    write_tasks(tmp_path / "t.jsonl", picked + import_humaneval()[:2])  # HumanEval's tasks carry no repair
    tok = load_tokenizer(tiny_model)
    refs = References(tmp_path / "t.jsonl", tok, AgentConfig(), seed=1, repairs=1.0)
    plain = References(tmp_path / "t.jsonl", tok, AgentConfig(), seed=1)
    by_id = {t.task_id: t for t in [*picked, *import_humaneval()[:2]]}
    for i in range(10):
        s, p = refs.sample(by_id[list(by_id)[i]], i), plain.sample(by_id[list(by_id)[i]], i)
        task = by_id[s.task_id]
        trained = tok.decode([x for x, m in zip(s.tokens, s.loss_mask, strict=True) if m])
        assert trained == reference_reply(task) + "<|im_end|>"  # only the fix is trained
        context = tok.decode(s.tokens[: int(np.argmax(s.loss_mask))])
        if "repair" in task.metadata:
            obs = repair_observation(task)
            assert obs is not None and obs in context and "Examples:" in obs
            assert task.metadata["repair"]["attempt"] in context and len(s.tokens) > len(p.tokens)
            # the context continues the prompt the way an episode does: attempt, then the observation's user turn
            n_prompt = int(np.argmax(p.loss_mask))
            assert list(s.tokens[:n_prompt]) == list(p.tokens[:n_prompt])
        else:
            assert list(s.tokens) == list(p.tokens)
