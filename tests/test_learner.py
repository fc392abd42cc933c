"""The learner as a real job: DeepSpeed (gloo, CPU) trains on committed
rollout batches, each once, publishes weight versions, and resumes
bit-exact after SIGKILLs.

The policy is a small Llama with SmolLM2's tokenizer and architecture
(2 layers of width 64, random weights from a fixed seed), so that a step
takes a second here; the rollouts are HumanEval prompts with their
reference solutions as the sampled tokens. Both are real data and a real
model; only the size is chosen for the test."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_config, sarl, task_state, wait_for, write_config
from learner_runs import learner_config, learner_state, published_weights, rollout_batches, start_learner

from rl.store import Sample, Store


@pytest.mark.slow
def test_learner_trains_each_batch_once_and_publishes_every_version(workdir: Path, tiny_model: Path) -> None:
    run = start_learner(workdir, "a", tiny_model, steps=3, learner={"keep_versions": 2, "loss": {"kl_coef": 0.1}})
    try:
        # `--wait` through a pipe, as in a batch job's log: plain lines, the learner's steps, no carriage return
        waited = sarl("status", str(run), "--wait", "--every", "1", cwd=run.parents[1])
        assert "\r" not in waited.stdout + waited.stderr
        lines = waited.stderr.splitlines()
        seen = [int(re.search(r"  step (\d)/3", line).group(1)) for line in lines]  # type: ignore[union-attr]
        assert len(lines) >= 2 and seen == sorted(seen) and seen[-1] == 3, waited.stderr
        assert re.search(r"step 3/3 \(\d+ s/step\); learner 1 done$", lines[-1]), lines[-1]
        assert "learner     RL, step 3/3 (" in waited.stdout  # then the status, as `sarl status` prints it
        state = task_state(run, 0, "learner")
        assert state["step"] == 3 and state["batches"] == 3 and state["quarantined"] == {}
        store = Store(run / "store.zarr")
        assert store.weights.versions() == [2, 3]  # published each step, the last 2 kept
        w2, w3 = published_weights(run, 2), published_weights(run, 3)
        assert set(w2) and any(not np.array_equal(w2[k], w3[k]) for k in w2)  # it trained
        assert np.isfinite(state["mismatch_kl"]) and state["mismatch_kl"] > 0.05  # behaviour log-probs differ
        assert state["kl_ref"] > 0 and state["entropy"] > 0  # step 3's policy has moved from the base (k3 > 0)
        from rl.learner.checkpoints import LearnerCheckpoints

        ck = LearnerCheckpoints(run).latest()
        assert ck is not None and ck.step == 3
        applied = [k for _, keys in ck.meta["history"] for k in keys]
        assert sorted(applied) == sorted(f"rollout-000000/{s}" for s in range(3))
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run / "tb" / "learner"), size_guidance={"scalars": 0})
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        expected = {"loss", "policy_loss", "kl_ref", "mismatch_kl", "grad_norm", "reward_mean", "entropy", "clip_frac"}
        expected |= {"ratio_mean", "ratio_max", "lr", "tokens_per_s", "step_s", "dropped_stale", "staleness"}
        expected |= {"advantage_abs", "reward_std", "response_len", "idle_ratio", "weight_change", "groups_with_signal"}
        expected |= {"publish_s", "checkpoint_s"}
        assert {f"learner/{t}" for t in expected} <= tags, sorted(tags)
        assert "learner/staleness_hist" in acc.Tags()["histograms"]
        assert [e.step for e in acc.Scalars("learner/loss")] == [1, 2, 3]
        # the distance from the start: ||w3 - w0|| / ||w0|| over the model file's weights
        from safetensors.torch import load_file

        base = {k: v.numpy().astype(np.float64) for k, v in load_file(str(tiny_model / "model.safetensors")).items()}
        num = sum(float(((w3[k].astype(np.float64) - base[k]) ** 2).sum()) for k in base if k in w3)
        want = (num / sum(float((b**2).sum()) for k, b in base.items() if k in w3)) ** 0.5
        assert state["weight_change"] == pytest.approx(want, rel=1e-3) and want > 0
        changes = [e.value for e in acc.Scalars("learner/weight_change")]
        assert len(changes) == 3 and changes[0] > 0 and changes[-1] == pytest.approx(want, rel=1e-3)
        # each batch holds 2 groups of rewards 0 and 1: every group has a signal
        assert [e.value for e in acc.Scalars("learner/groups_with_signal")] == [1.0, 1.0, 1.0]
        import json

        glance = json.loads(sarl("status", str(run), "--json", cwd=run.parents[1]).stdout)["training"]["learner"]
        assert glance["step"] == glance["steps"] == 3 and glance["published_version"] == 3
        assert glance["batches_consumed"] == 3 and glance["loss"] is not None
        assert glance["kind"] == "rl" and glance["reward_mean"] is not None and "tokens_per_s" not in glance
        text = sarl("status", str(run), cwd=run.parents[1]).stdout
        assert re.search(
            r"learner     RL, step 3/3 \(\d+ s/step\), published version 3, 3 batches consumed; reward", text
        )
        # the learner's log, under the attempt it comes from
        logs = sarl("logs", str(run), "learner/0", "-n", "0", cwd=run.parents[1]).stdout
        assert re.search(
            r"^==> learner/0 #1 \(job \d+ on .*, from the beginning\) stderr: .*_0_log.err <==$", logs, re.M
        )
        assert "sarl.learner INFO step 3: loss" in logs
        _check_report_and_tensorboard(run)
    finally:
        sarl("cancel", str(run), cwd=run.parents[1], check=False)


def _check_report_and_tensorboard(run: Path) -> None:
    """`sarl report` writes its plots and page; the real `tensorboard` serves
    the run's curves (its HTTP API lists the learner's tags)."""
    import base64
    import socket
    import urllib.request

    out = sarl("report", str(run), cwd=run.parents[1])
    assert "learner     RL, step 3/3" in out.stdout
    folder = run / "report"
    for name in ("reward", "pass1", "failures", "throughput", "learning", "policy", "agent", "control"):
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (folder / "index.html").read_text()
    images = [x.split('"', 1)[0] for x in page.split("data:image/png;base64,")[1:]]
    assert len(images) == 8 and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)  # self-contained
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tb = Path(sys.executable).parent / "tensorboard"
    cmd = [str(tb), "--logdir", str(run / "tb"), "--port", str(port), "--host", "127.0.0.1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def tags() -> dict | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    got = json.loads(r.read())
            except OSError:
                return None
            return got if "learner" in got else None

        got = wait_for(tags, 90, "tensorboard to serve the run")
        assert {"learner/loss", "learner/mismatch_kl", "learner/entropy"} <= set(got["learner"])
    finally:
        proc.terminate()
        proc.wait(10)


class _Feed:
    """What the learner tells `take_step` while it waits, recorded."""

    def __init__(self, stop: bool = True, exhausted: Any = lambda: False) -> None:
        self.stop, self.skipped, self._exhausted = stop, [], exhausted

    def should_stop(self) -> bool:
        return self.stop

    def skip(self, key: tuple[str, int], why: str) -> None:
        self.skipped.append((key, why))

    def exhausted(self) -> bool:
        return bool(self._exhausted())


def test_a_step_takes_whole_groups_and_drops_stale_ones_counted(tmp_path: Path) -> None:
    from rl.learner.data import Need, micro_batches, take_step
    from rl.store import Cursor

    store = Store(tmp_path)
    w = store.writer("rollout-000000")
    feed = _Feed(stop=True)

    def group(g: int, version: int, n: int = 2, length: int = 5) -> list[Sample]:
        ids = np.arange(length, dtype=np.int32)
        mask = np.array([0] + [1] * (length - 1), dtype=np.uint8)
        return [Sample("t", g, version, ids, mask, np.zeros(length, np.float32), 1.0) for _ in range(n)]

    w.write(0, group(0, version=0) + group(1, version=3))
    w.write(1, group(2, version=2, length=9))
    got = take_step(store, Cursor(), 4, Need(4, max_staleness=2, poll_s=0.01), feed)
    assert got is not None and got.dropped_stale == 2  # group 0 is 4 versions behind: dropped whole
    # and recorded as given up, so that the async gate lets another group start in its place
    assert store.given_up.groups() == {0} and "stale: sampled by version 0" in str(store.given_up.reason(0))
    assert sorted(s.group_id for s in got.samples) == [1, 1, 2, 2] and len(got.keys) == 2
    sync = take_step(store, Cursor(), 3, Need(2, sync=True, poll_s=0.01), feed)
    assert sync is not None and {s.policy_version for s in sync.samples} == {3}  # sync: version 3 alone
    assert sync.dropped_stale == 2 and sync.keys == [("rollout-000000", 0)]
    more = take_step(store, Cursor(), 3, Need(4, sync=True, poll_s=0.01), feed)
    assert more is None  # only 2 samples of version 3 exist: a sync step waits for more (here: stops)
    parts = micro_batches(got.samples, 2)
    assert sorted(sum(len(s.tokens) for s in p) for p in parts) == [14, 14]
    assert [len(p) for p in micro_batches(got.samples[:1], 3)] == [1, 0, 0]  # every rank's micro-steps exist
    # a token budget: padded size (longest x count) at most 18: [9, 9] then [5, 5, 5] (15), never [9, 5, 5]
    packed = micro_batches(got.samples + group(9, version=4), token_budget=18)
    assert [[len(s.tokens) for s in p] for p in packed] == [[9, 9], [5, 5, 5], [5]]
    by_tokens = take_step(store, Cursor(), 4, Need(1, tokens=9, max_staleness=2, poll_s=0.01), feed)
    assert by_tokens is not None and len(by_tokens.keys) == 2  # batch 0 trains 8 tokens (< 9): batch 1 too
    # a corrupt chunk: the batch is skipped with its reason, and the next one is trained on
    w.write(2, group(3, version=4))
    w.write(3, group(4, version=4))
    chunks = list((tmp_path / "rollouts" / "rollout-000000" / f"{2:010d}" / "tokens").glob("c.*"))
    assert chunks
    for p in chunks:
        p.write_bytes(b"\x00garbage" * 3)
    cursor = Cursor()
    cursor.add(("rollout-000000", 0))
    cursor.add(("rollout-000000", 1))
    got = take_step(store, cursor, 4, Need(2, max_staleness=0, poll_s=0.01), feed)
    assert got is not None and got.keys == [("rollout-000000", 3)]
    assert [k for k, _ in feed.skipped] == [("rollout-000000", 2)] and "unreadable batch" in feed.skipped[0][1]


def test_once_no_batch_will_come_what_is_left_makes_a_last_smaller_step(tmp_path: Path) -> None:
    """`exhausted()` is asked before each scan: a batch committed before the
    rollouts said they were done is always seen by the scan after it."""
    from rl.learner.data import Need, take_step
    from rl.store import Cursor

    store = Store(tmp_path)
    w = store.writer("rollout-000000")
    need = Need(4, poll_s=0.01)
    ids, mask = np.arange(5, dtype=np.int32), np.array([0, 1, 1, 1, 1], dtype=np.uint8)
    for g in range(3):
        w.write(g, [Sample("t", g, 0, ids, mask, np.zeros(5, np.float32), 1.0) for _ in range(2)])
    cursor = Cursor()
    first = take_step(store, cursor, 0, need, _Feed(stop=False))
    assert first is not None and len(first.samples) == 4
    for key in first.keys:
        cursor.add(key)
    calls: list[int] = []

    def exhausted() -> bool:  # the worker says it is done only after the scan that missed its last batch
        calls.append(1)
        if len(calls) == 2:
            w.write(3, [Sample("t", 3, 0, ids, mask, np.zeros(5, np.float32), 1.0) for _ in range(2)])
        return len(calls) >= 2

    last = take_step(store, cursor, 0, need, _Feed(stop=False, exhausted=exhausted))
    assert last is not None and [k[1] for k in last.keys] == [2, 3] and len(last.samples) == 4
    for key in last.keys:
        cursor.add(key)
    assert take_step(store, cursor, 0, need, _Feed(stop=False, exhausted=lambda: True)) is None


def test_a_sync_round_with_groups_given_up_is_whole_without_them(tmp_path: Path) -> None:
    """Round 1 of 3 groups (3, 4, 5): group 4 is committed, group 3 given up
    (dynamic sampling), group 5 not yet decided, so the step waits; once 5
    is given up too, the round is whole and the step trains on group 4
    alone. A round given up whole is an empty step, which the learner
    publishes all the same. A group both given up and committed (a worker
    killed between the two) is trained on once."""
    from rl.learner.data import Need, take_step
    from rl.store import Cursor

    store = Store(tmp_path)
    w = store.writer("rollout-000000")
    ids, mask = np.arange(5, dtype=np.int32), np.array([0, 1, 1, 1, 1], dtype=np.uint8)

    def group(g: int, version: int) -> list[Sample]:
        return [
            Sample("t", g, version, ids, mask, np.zeros(5, np.float32), float(i), episode_id=f"{g}/{i}")
            for i in range(2)
        ]

    need = Need(6, sync=True, groups_per_step=3, poll_s=0.01)
    w.write(0, group(4, version=1))
    store.given_up.record(3, "dynamic sampling: every reward equal", "rollout-000001")
    assert take_step(store, Cursor(), 1, need, _Feed(stop=True)) is None  # group 5 may still come
    store.given_up.record(5, "sandbox: died 3 times", "rollout-000002")
    store.given_up.record(5, "recorded twice: the first stands", "rollout-000002")
    got = take_step(store, Cursor(), 1, need, _Feed(stop=True))
    assert got is not None and [s.group_id for s in got.samples] == [4, 4] and got.given_up == 2
    assert got.keys == [("rollout-000000", 0)] and store.given_up.reason(5) == "sandbox: died 3 times"
    for g in (6, 7, 8):  # round 2: every group given up
        store.given_up.record(g, "dynamic sampling: every reward equal", "rollout-000000")
    cursor = Cursor()
    cursor.add(("rollout-000000", 0))
    empty = take_step(store, cursor, 2, need, _Feed(stop=True))
    assert empty is not None and empty.samples == [] and empty.keys == [] and empty.given_up == 3
    w.write(1, group(9, version=3))  # round 3: group 9 given up and committed, 10 committed, 11 given up
    w.write(2, group(10, version=3))
    for g in (9, 11):
        store.given_up.record(g, "dynamic sampling: every reward equal", "rollout-000000")
    got = take_step(store, cursor, 3, need, _Feed(stop=True))
    assert got is not None and [s.group_id for s in got.samples] == [9, 9, 10, 10] and got.given_up == 1
    assert take_step(store, cursor, 3, Need(6, sync=True, poll_s=0.01), _Feed(stop=True)) is None  # no round size


# ----------------------------------------------------------------- learning


def _learn(workdir: Path, tiny_model: Path, name: str, shuffle: bool, rounds: int) -> list[float]:
    """A run of a live generator and the learner; the test plays the rollout
    worker. Round v: 2 groups of 8 replies sampled by the generator at
    version v (12 tokens each), rewarded by the share of reply tokens from the lower half of
    the vocabulary, committed; the learner trains step v + 1 on them alone
    (staleness 0), publishes version v + 1, and the generator swaps to it.
    The control shuffles the rewards over the round's samples: the same
    updates in size, no signal. Returns each round's mean reward."""
    from rl.engine.config import SamplingParams
    from rl.model import chat_ids, load_tokenizer
    from rl.serving.client import GeneratorClient

    folder = workdir / name
    folder.mkdir()
    body = run_config(
        "l",
        run={"seed": 3, "max_staleness": 0},
        executor={"type": "local"},
        model={"path": tiny_model, "dtype": "float32"},
        generator={"poll_s": 0.2, "engine": {"type": "hf", "max_model_len": 128, "threads": 1}},
        learner={
            "steps": rounds,
            "samples_per_step": 16,
            "poll_s": 0.1,
            "threads": 1,
            "precision": "float32",
            "optimizer": {"lr": 3e-2},
        },
    )
    sarl("submit", str(write_config(folder, body)), cwd=folder)
    run = folder / "runs" / "l"
    tok = load_tokenizer(tiny_model)
    prompt = chat_ids(tok, [{"role": "user", "content": "Say something."}])
    vocab = len(tok)
    writer = Store(run / "store.zarr").writer("rollout-000000")
    rng = np.random.default_rng(7)
    rewards_by_round = []
    try:
        # the two runs' generators start side by side, beside the other stream's tests: minutes, loaded
        client = GeneratorClient(run, timeout_s=120, wait_for_generator_s=300)
        for v in range(rounds):
            sampling = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, n=8, seed=1000 + v)

            def sampled(v: int = v, sampling: SamplingParams = sampling) -> object:
                r = client.generate([prompt, prompt], sampling)
                return r if r.version == v else None

            resp = wait_for(sampled, 120, f"the generator to serve version {v}", every=0.2)
            samples = []
            for g, outs in enumerate(resp.outputs):
                for i, c in enumerate(outs):
                    reward = float(np.mean(np.asarray(c.token_ids) < vocab // 2))
                    ids = np.array(prompt + c.token_ids, dtype=np.int32)
                    mask = np.array([0] * len(prompt) + [1] * len(c.token_ids), dtype=np.uint8)
                    lp = np.array([0.0] * len(prompt) + list(c.logprobs), dtype=np.float32)
                    group, episode = 2 * v + g, f"{2 * v + g}/{i}"
                    samples.append(Sample("say", group, v, ids, mask, lp, reward, episode_id=episode, temperature=1.0))
            rewards = [s.reward for s in samples]
            rewards_by_round.append(float(np.mean(rewards)))
            if shuffle:
                for s, r in zip(samples, rng.permutation(rewards), strict=True):
                    s.reward = float(r)
            writer.write(writer.next_seq(), samples)
        wait_for(lambda: learner_state(run).get("done"), 300, "the learner to finish")
        state = learner_state(run)
        assert state["step"] == rounds and state["batches"] == rounds and state["dropped_stale"] == 0
        assert abs(state["mismatch_kl"]) < 1e-3  # the generator sampled with the weights trained on
    finally:
        sarl("cancel", str(run), cwd=folder, check=False)
    return rewards_by_round


@pytest.mark.slow
def test_a_tiny_model_learns_from_reward_alone_and_a_shuffled_control_does_not(workdir: Path, tiny_model: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    rounds = 16
    with ThreadPoolExecutor(2) as pool:  # side by side: each round mostly waits on the other roles
        runs = [
            pool.submit(_learn, workdir, tiny_model, name, name == "shuffled", rounds)
            for name in ("reward", "shuffled")
        ]
        learned, control = (r.result() for r in runs)
    print("reward per round:", [round(r, 2) for r in learned], "control:", [round(r, 2) for r in control])
    # both start from the same random policy: about half its tokens are in the rewarded half
    assert abs(learned[0] - 0.5) < 0.15 and abs(control[0] - 0.5) < 0.15
    last_learned, last_control = float(np.mean(learned[-5:])), float(np.mean(control[-5:]))
    assert last_learned >= 0.9, learned
    assert last_control <= 0.75, control
    assert last_learned - last_control >= 0.2


@pytest.mark.parametrize(
    ("learner", "words"),
    [
        ({"loss": {"type": "ppo2"}}, "learner.loss"),
        ({"max_staleness": -1}, "learner.max_staleness: moved to run.max_staleness"),
        ({"lr_typo": 1}, "learner.lr_typo: unknown key"),
        ({"train_top_layers": 3}, "learner.train_top_layers = 3: "),
        ({"loss": {"kl_coef": -0.1}}, "learner.loss.kl_coef"),
        ({"loss": {"type": "sft", "source": "references"}}, "tasks_file: source = 'references' needs"),
        ({"loss": {"type": "sft", "source": "references", "tasks_file": "nope.jsonl"}}, "does not exist"),
        ({"loss": {"type": "sft", "source": "traces"}}, "traces_file: source = 'traces' needs it"),
        ({"loss": {"type": "sft", "source": "traces", "traces_file": "nope.jsonl"}}, "traces_file: /"),
        ({"loss": {"type": "sft", "source": "passing", "traces_file": "t.jsonl"}}, "traces_file: source = 'traces'"),
        ({"correction": {"band_low": 3.0}}, "band_low = 3.0 must be below band_high"),
        ({"job": {"tasks_per_node": 3}}, "micro_batches = 2 is not a multiple of the 3 ranks"),
        ({"generator": {"job": {"tasks_per_node": 2}}}, "generator.job: nodes = 1, tasks_per_node = 2"),
    ],
)
def test_bad_learner_input_is_refused_before_submission(
    workdir: Path, tiny_model: Path, learner: dict[str, Any], words: str
) -> None:
    generator = learner.pop("generator", None)  # a section of its own; the rest are the learner's keys
    body = learner_config(tiny_model, 2, learner, generator=generator)
    out = sarl("submit", str(write_config(workdir, body)), cwd=workdir, check=False)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert not (workdir / "runs" / "l").exists()


def test_references_become_the_reply_the_agent_protocol_asks_for(tiny_model: Path, tmp_path: Path) -> None:
    from rl.agent.config import AgentConfig
    from rl.learner.references import References, reference_reply
    from rl.model import load_tokenizer
    from rl.tasks.format import write_tasks
    from rl.tasks.importers import import_humaneval

    tasks = import_humaneval()[:5]
    write_tasks(tmp_path / "t.jsonl", tasks)
    tok = load_tokenizer(tiny_model)
    refs = References(tmp_path / "t.jsonl", tok, AgentConfig(), seed=1)
    s = refs.step(0, 3)[0]
    trained = tok.decode([t for t, m in zip(s.tokens, s.loss_mask, strict=True) if m])
    task = next(t for t in tasks if t.task_id == s.task_id)
    assert trained == reference_reply(task) + "<|im_end|>"  # the whole function in a python block, then the end
    # the function as it runs, without the task's docstring copied back; the code compiles and passes
    for t in tasks:
        code = reference_reply(t).removeprefix("```python\n").removesuffix("\n```")
        assert f"def {t.entry_point}(" in code and t.reference.strip() in code and '"""' not in code.split("def ")[-1]
        scope: dict = {}
        exec(compile(code + "\n\n" + t.tests + f"\ncheck({t.entry_point})\n", t.task_id, "exec"), scope)
    assert "Complete the following Python function" in tok.decode(s.tokens[: int(np.argmax(s.loss_mask))])
    # a pass over the file visits every task once; the order follows from the seed and step alone
    first_pass = [x.task_id for k in range(5) for x in refs.step(k, 1)]
    assert sorted(first_pass) == sorted(t.task_id for t in tasks)
    again = References(tmp_path / "t.jsonl", tok, AgentConfig(), seed=1)
    assert [x.task_id for x in again.step(3, 2)] == [x.task_id for x in refs.step(3, 2)]


@pytest.mark.slow
def test_sft_on_task_references_lowers_their_loss_and_publishes(workdir: Path, tiny_model: Path) -> None:
    from rl.tasks.format import write_tasks
    from rl.tasks.importers import import_humaneval

    folder = workdir / "sft"
    folder.mkdir()
    write_tasks(folder / "train.jsonl", import_humaneval()[:4])
    loss = {"type": "sft", "source": "references", "tasks_file": "train.jsonl"}
    body = learner_config(tiny_model, 8, {"train_top_layers": 1, "optimizer": {"lr": 1e-2}, "loss": loss})
    sarl("submit", str(write_config(folder, body)), cwd=folder)
    run = folder / "runs" / "l"
    try:
        wait_for(lambda: learner_state(run).get("done"), 400, "the SFT learner")
        state = learner_state(run)
        assert state["step"] == 8 and state["batches"] == 0  # no rollout read
        assert Store(run / "store.zarr").weights.latest() == 8
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run / "tb" / "learner"), size_guidance={"scalars": 0})
        acc.Reload()
        loss = [e.value for e in acc.Scalars("learner/loss")]
        # each step takes 4 of the 4 tasks (one pass): the same data, so the NLL must fall
        # (slowly: one block of width 64 learns, on a random model)
        assert len(loss) == 8 and loss[-1] < 0.95 * loss[0] and loss == sorted(loss, reverse=True), loss
        # train_top_layers = 1: the top block and the final norm learned; the rest is the base, to the bit
        import torch
        from safetensors.torch import load_file

        base = load_file(str(tiny_model / "model.safetensors"))
        _, trained = Store(run / "store.zarr").weights.load(8)
        changed = {k for k in base if not torch.equal(base[k], trained[k])}
        assert changed and all(k.startswith(("model.layers.1.", "model.norm.")) for k in changed), sorted(changed)
    finally:
        sarl("cancel", str(run), cwd=folder, check=False)


@pytest.mark.slow
def test_bench_learner_reports_each_figure_beside_its_baseline(workdir: Path, tiny_model: Path) -> None:

    out = sarl("bench", "learner", "--quick", "--json", "--model", str(tiny_model), "--engine", "hf", cwd=workdir)
    r = json.loads(out.stdout)
    for name in ("fp32", "bf16", "autocast", "auto", "lora", "torch"):
        assert r[f"{name}_tok_s"] > 0 and r[f"{name}_peak_gb"] > 0.1, name
    assert (
        r["fp32_precision"] == "float32"
        and r["bf16_precision"] == "bf16"
        and r["autocast_precision"] == "bf16-autocast"
    )
    assert r["bf16_over_fp32"] == pytest.approx(r["bf16_tok_s"] / r["fp32_tok_s"], rel=0.01)
    assert r["lora_over_full_step"] == pytest.approx(r["lora_step_s"] / r["auto_step_s"], rel=0.01)
    assert r["ratio"] == pytest.approx(r["autocast_tok_s"] / r["torch_tok_s"], rel=0.01)
    assert r["auto_no_bf16_precision"] == "float32"  # this CPU with its bf16 flags hidden
    assert r["auto_precision"] == ("bf16" if "no bf16" not in r["machine"] else "float32")
    # a LoRA version is its adapters: a small fraction of the weights' bytes
    assert 0 < r["lora_bytes"] < 0.2 * r["full_bytes"] and r["lora_publish_load_s"] > 0
    assert r["tokens_per_step"] > 50


@pytest.mark.slow
def test_sync_mode_trains_each_round_alone_and_any_commit_order_gives_the_same_weights(
    workdir: Path, tiny_model: Path
) -> None:
    """Sync: step N + 1 trains on exactly the samples of version N. Two runs
    get the same rounds committed by different writers in different orders
    (round 1 before round 0 in the second): both end on the same weights,
    to the bit, and each step consumed its own round's batches."""
    runs = []
    for name, order in (("in-order", [0, 1, 2, 3]), ("shuffled", [3, 2, 1, 0])):
        folder = workdir / name
        folder.mkdir()
        body = learner_config(tiny_model, 2, run={"max_staleness": None, "mode": "sync"})
        sarl("submit", str(write_config(folder, body)), cwd=folder)
        run = folder / "runs" / "l"
        store = Store(run / "store.zarr")
        batches = rollout_batches(tiny_model, groups=4, per_batch=1)  # 4 batches of 1 group (2 samples)
        for k in order:  # batches 0-1 are round 0 (version 0), 2-3 round 1, each by its own writer
            for x in batches[k]:
                x.policy_version = k // 2
            w = store.writer(f"rollout-{k:06d}")
            w.write(w.next_seq(), batches[k])
        runs.append(run)
    try:
        for run in runs:
            wait_for(lambda run=run: learner_state(run).get("done"), 400, "the sync learner")
        from rl.learner.checkpoints import LearnerCheckpoints

        for run in runs:
            ck = LearnerCheckpoints(run).latest()
            assert ck is not None
            steps = {step: sorted(keys) for step, keys in ck.meta["history"]}
            assert steps == {1: ["rollout-000000/0", "rollout-000001/0"], 2: ["rollout-000002/0", "rollout-000003/0"]}
        a, b = published_weights(runs[0], 2), published_weights(runs[1], 2)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    finally:
        for run in runs:
            sarl("cancel", str(run), cwd=run.parents[1], check=False)


def test_log_probs_are_computed_only_where_trained_and_match_the_full_softmax(tiny_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rl.learner.logprobs import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (3, 12))
    attn = torch.ones_like(ids)
    attn[2, 10:] = 0  # a padded row
    mask = torch.zeros(3, 12)
    mask[0, 6:], mask[1, 8:11], mask[2, 7:10] = 1, 1, 1
    logp, entropy, keep = token_logprobs(model, ids, attn, mask)
    full = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits[:, :-1].float(), -1)
    want = full.gather(-1, ids[:, 1:, None]).squeeze(-1)
    trained = mask[:, 1:] > 0
    assert keep.tolist() == list(range(5, 11))  # positions 5..10 predict tokens 6..11: no prompt-only column
    assert torch.allclose(logp[trained], want[trained], atol=1e-5)
    assert (logp[:, :5] == 0).all()
    rows = full[trained]
    assert float(entropy.detach()) == pytest.approx(float(-(rows.exp() * rows).sum().detach()), rel=1e-4)
    logp[trained].sum().backward()  # the gradient reaches the weights
    assert float(model.model.embed_tokens.weight.grad.abs().sum()) > 0
    nothing, _, kept = token_logprobs(model, ids, attn, torch.zeros(3, 12))
    assert kept.tolist() == [10] and nothing.requires_grad  # a weight-0 pass still has a graph


def test_behaviour_log_probs_are_of_the_tempered_distribution_the_learner_recomputes(tiny_model: Path) -> None:
    """Replies sampled at temperatures 0.7 and 1.5 by the HF engine, in one
    batch: the log-probs each records are those of logits / its temperature,
    and the trainer takes each sample's own at the temperature the sample
    carries, so that its importance weights compare like with like
    (mismatch_kl about 0). The same samples labelled with the wrong
    temperatures show the mismatch, and the untempered distribution's
    log-probs differ from the recorded ones."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig, SamplingParams
    from rl.learner.config import LearnerRole
    from rl.learner.logprobs import token_logprobs
    from rl.learner.trainer import Trainer
    from rl.model import ModelConfig

    engine = make_engine(HFEngineConfig(max_model_len=256), ModelConfig(path=str(tiny_model), dtype="float32"))
    prompt = list(range(5, 25))
    temps = (0.7, 1.5)
    try:
        replies = [
            engine.generate([prompt], SamplingParams(temperature=t, max_tokens=12, n=2, seed=3, ignore_eos=True))[0]
            for t in temps
        ]
    finally:
        engine.close()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    c = replies[0][0]
    ids = torch.tensor([prompt + c.token_ids])
    mask = torch.tensor([[0.0] * len(prompt) + [1.0] * len(c.token_ids)])
    trained = mask[:, 1:] > 0
    with torch.no_grad():
        tempered = token_logprobs(model, ids, torch.ones_like(ids), mask, temperature=0.7)[0][trained]
        plain = token_logprobs(model, ids, torch.ones_like(ids), mask)[0][trained]
    recorded = torch.tensor(c.logprobs)
    assert torch.allclose(tempered, recorded, atol=1e-4), (tempered - recorded).abs().max()
    assert float((plain - recorded).abs().max()) > 1e-2

    def batch(labels: tuple[float, float]) -> list[Sample]:
        out = []
        for g, (outs, t) in enumerate(zip(replies, labels, strict=True)):
            for i, c in enumerate(outs):
                ids = np.array(prompt + c.token_ids, dtype=np.int32)
                mask = np.array([0] * len(prompt) + [1] * len(c.token_ids), dtype=np.uint8)
                lp = np.array([0.0] * len(prompt) + list(c.logprobs), dtype=np.float32)
                out.append(Sample("t", g, 0, ids, mask, lp, float(i), episode_id=f"{g}/{i}", temperature=t))
        return out

    kl = {}
    for name, labels in (("right", temps), ("wrong", temps[::-1])):
        lc = LearnerRole.model_validate({"steps": 1, "samples_per_step": 4, "precision": "float32"})
        metrics = Trainer(str(tiny_model), lc).step(batch(labels))
        assert metrics is not None
        kl[name] = metrics["mismatch_kl"]
    assert abs(kl["right"]) < 1e-5 and kl["wrong"] > 1e-3, kl  # measured: 0 and 5.9e-3


def test_several_updates_a_step_clip_against_the_weights_before_the_step(tiny_model: Path) -> None:
    """One update a step: the ratio is 1 and the clip cannot bind. Four
    (two epochs of two minibatches), at a learning rate that moves the
    weights: the later updates' ratios leave [1 - clip, 1 + clip] and are
    clipped; the schedule counts learner steps, not updates."""
    from rl.learner.config import LearnerRole
    from rl.learner.trainer import Trainer

    samples = [s for b in rollout_batches(tiny_model, groups=4) for s in b]
    figures = {}
    for epochs, minibatches in ((1, 1), (2, 2)):
        raw = {"steps": 4, "samples_per_step": 8, "ppo_epochs": epochs, "minibatches": minibatches}
        raw.update(optimizer={"lr": 3e-2, "warmup_steps": 2}, loss={"clip": 0.05})
        lc = LearnerRole.model_validate(raw)
        metrics = Trainer(str(tiny_model), lc).step(samples)
        assert metrics is not None
        figures[epochs * minibatches] = metrics
    assert figures[1]["clip_frac"] == 0.0 and figures[1]["updates"] == 1
    assert figures[4]["clip_frac"] > 0.0 and figures[4]["updates"] == 4
    assert figures[1]["lr"] == figures[4]["lr"] == pytest.approx(3e-2 * 2 / 3)  # warmup counts learner steps


def test_a_control_step_trains_on_the_same_samples_with_their_rewards_permuted() -> None:
    """`learner.shuffle_rewards`: the rewards of a step are a permutation of
    its own (so reward_mean is unchanged), the same for the same seed and
    step, another for another step; tokens and everything else stay."""
    from rl.learner.data import shuffled_rewards

    ids, mask = np.arange(5, dtype=np.int32), np.array([0, 1, 1, 1, 1], dtype=np.uint8)
    samples = [Sample("t", g, 0, ids + g, mask, np.zeros(5, np.float32), float(g * 2 + i)) for g in range(4)
               for i in range(2)]  # fmt: skip
    a, b = shuffled_rewards(samples, 1, 3), shuffled_rewards(samples, 1, 3)
    assert [s.reward for s in a] == [s.reward for s in b]  # reproducible
    assert sorted(s.reward for s in a) == [s.reward for s in samples]  # a permutation
    assert [s.reward for s in a] != [s.reward for s in samples]
    assert [s.reward for s in shuffled_rewards(samples, 1, 4)] != [s.reward for s in a]
    assert all(np.array_equal(x.tokens, y.tokens) and x.group_id == y.group_id for x, y in zip(a, samples, strict=True))
