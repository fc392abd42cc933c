"""Evaluation: the pass@k estimator against hand computations, and
`sarl eval` end to end (the rollouts' agent, real sandboxes and verifier,
an engine it starts itself, and the run's live generator)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_config, sarl, task_state, wait_for, write_config

from rl.eval.passk import clustered_se, mean_and_se, pass_at_k
from rl.eval.run import play_mode, results_folder, summarise, task_result
from rl.tasks.format import Task


def test_pass_at_k_matches_hand_computation() -> None:
    # n = 5, c = 2: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass@5 = 1
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 5) == 1.0 and pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))
    assert pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100))
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    # three tasks with 4 samples each: 1, 2 and 4 passing
    tasks = [Task(task_id=f"t{i}", prompt="", entry_point="f", tests="assert 1") for i in range(3)]
    results = [
        task_result(t, [j < c for j in range(4)], ["" if j < c else "wrong" for j in range(4)], [1] * 4, [1, 2])
        for t, c in zip(tasks, (1, 2, 4), strict=True)
    ]
    s = summarise(results, [1, 2])
    p1 = [0.25, 0.5, 1.0]
    p2 = [1 - math.comb(3, 2) / 6, 1 - math.comb(2, 2) / 6, 1.0]
    assert s["pass@1"] == pytest.approx(sum(p1) / 3, abs=1e-4)
    assert s["pass@2"] == pytest.approx(sum(p2) / 3, abs=1e-4)
    mean = sum(p1) / 3
    se = math.sqrt(sum((x - mean) ** 2 for x in p1) / 2 / 3)
    assert s["se@1"] == pytest.approx(se, abs=1e-4) and mean_and_se(p1)[1] == pytest.approx(se)
    assert s["failures"] == {"wrong": 3 + 2} and s["samples"] == 12
    assert s["crash_share"] == 0 and s["turn_2_share"] == 0 and s["turn_2_fix_rate"] is None  # one turn each
    # of 4 samples, 3 reached turn 2 (1 of them passed after it), and 1 crashed
    two = task_result(tasks[0], [True, False, True, False], ["", "wrong", "", "crash"], [1, 2, 2, 2], [1])
    s = summarise([two], [1])
    assert (s["crash_share"], s["turn_2_share"], s["turn_2_fix_rate"]) == (0.25, 0.75, round(1 / 3, 4))
    assert "tool_valid_share" not in s  # no tool calls: no tool figures
    # tool calls (calls, invalid, answered with an error) of each sample: 12 calls, 2 invalid, 3 errors
    tools = task_result(tasks[0], [True, False], ["", "wrong"], [3, 4], [1], [(5, 1, 2), (7, 1, 1)])
    s = summarise([tools], [1])
    assert (s["tool_calls_per_sample"], s["tool_valid_share"], s["tool_error_share"]) == (6.0, round(10 / 12, 4), 0.25)


def test_the_error_clustered_by_template_counts_templates_not_instances() -> None:
    """Eight instances of each of five templates, all of a template moving
    together: the per-task error is that of 40 observations, the clustered
    one that of 5 (about sqrt(8) larger). Independent instances, one per
    template, give the per-task error again."""
    per_template = [1.0, 1.0, 0.0, 1.0, 0.0]
    values = [v for v in per_template for _ in range(8)]
    clusters = [f"t{g}" for g in range(5) for _ in range(8)]
    _, se = mean_and_se(values)
    assert clustered_se(values, clusters) == pytest.approx(mean_and_se(per_template)[1], rel=1e-9)
    assert clustered_se(values, clusters) > 2.5 * se
    alone = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    singles = [str(i) for i in range(6)]
    assert clustered_se(alone, singles) == pytest.approx(mean_and_se(alone)[1])
    assert clustered_se([0.5, 0.5], ["a", "a"]) == 0.0  # one cluster: no error can be told


@pytest.mark.slow
def test_two_task_files_of_one_name_and_two_ways_of_playing_keep_their_results_apart(tmp_path: Path) -> None:
    """`a/held.jsonl` and `b/held.jsonl` evaluated on one version: the first
    is in `held.greedy.1turn/`, the second beside it under a digest of its
    path, and each finds its own folder again (a second evaluation replaces
    its own). The same file sampled, or played for more turns, is in a
    folder of its own: a sampled evaluation once replaced the greedy one's
    per-task results."""
    version = tmp_path / "eval" / "v000001"
    a, b = str(tmp_path / "a" / "held.jsonl"), str(tmp_path / "b" / "held.jsonl")
    greedy = play_mode(0.0, 1, 1)
    first = results_folder(version, a, greedy)
    assert first == version / "held.greedy.1turn"
    first.mkdir(parents=True)
    (first / "summary.json").write_text(json.dumps({"tasks_file": a}))
    second = results_folder(version, b, greedy)
    assert second != first and second.name.startswith("held.greedy.1turn-") and second.parent == version
    second.mkdir()
    (second / "summary.json").write_text(json.dumps({"tasks_file": b}))
    assert results_folder(version, a, greedy) == first and results_folder(version, b, greedy) == second
    others = {
        results_folder(version, a, play_mode(t, n, k)).name for t, n, k in ((1.0, 8, 1), (0.0, 1, 3), (0.7, 1, 2))
    }
    assert others == {"held.t1-n8.1turn", "held.greedy.3turns", "held.t0.7-n1.2turns"}


def test_sarl_eval_refuses_plays_it_cannot_pair_before_it_starts_an_engine(workdir: Path) -> None:
    """Each error names the flag, exits 2 and leaves nothing in the run: no
    eval folder, no engine folder (nothing was started)."""
    from rl.tasks.format import write_tasks
    from rl.tasks.synthesis import synthesize

    run = workdir / "runs" / "e"
    run.mkdir(parents=True)
    (run / "run.toml").write_text(run_config("e", run={"root": ".."}, executor={"type": "local"}))
    write_tasks(workdir / "held.jsonl", synthesize("filtering", 2, seed=2, difficulty=1))
    (workdir / "empty.jsonl").write_text("")
    cases = [
        (["-n", "1", "8", "--temperature", "0", "1", "0.5"], "-n 1 8 and --temperature 0.0 1.0 0.5: give as many"),
        (["-n", "2", "2", "--temperature", "1"], "a sampling given twice"),
        (["-n", "1", "0"], "-n 0: at least one sample per task"),
        (["-n", "1", "4", "-k", "8"], "-k 8: pass@k needs 1 <= k <= n = 4"),
        (["--tasks", "held.jsonl", "./held.jsonl"], "--tasks held.jsonl: given twice"),
    ]
    for flags, words in cases:
        argv = ["eval", str(run), *(["--tasks", "held.jsonl"] if "--tasks" not in flags else []), *flags]
        out = sarl(*argv, cwd=workdir, check=False)
        assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr, (flags, out.stderr)
    empty = sarl("eval", str(run), "--tasks", "held.jsonl", "empty.jsonl", cwd=workdir, check=False)
    assert empty.returncode == 1 and "empty.jsonl: no task" in empty.stderr  # the second file read before a start
    assert sorted(p.name for p in run.iterdir()) == ["run.toml"]


@pytest.mark.slow  # 50 s alone: out of the fast tier
def test_sarl_eval_plays_the_agent_on_its_own_engine_and_on_a_live_generator(workdir: Path, tiny_model: Path) -> None:
    """The tiny Llama (HF engine) on generated tasks: results per task and a
    summary, written in the run directory; the same figures through the
    run's live generator, with the same seeds. (What the figures are for a
    real model is `sarl bench learn`'s business; here the plumbing.)"""
    from rl.tasks.format import read_tasks, write_tasks
    from rl.tasks.synthesis import synthesize

    write_tasks(workdir / "held.jsonl", synthesize("filtering", 3, seed=2, difficulty=1))
    body = run_config(
        "e",
        recovery=False,  # a test of the manual path (sarl resume); tests/test_recovery.py turns it on
        executor={"type": "local"},
        model={"path": tiny_model, "dtype": "float32"},
        generator={"poll_s": 0.5, "engine": {"type": "hf", "max_model_len": 1024}},
    )
    cfg = write_config(workdir, body)
    sarl("submit", str(cfg), cwd=workdir)
    run = workdir / "runs" / "e"
    try:
        sarl("cancel", str(run), cwd=workdir)  # first: the engine started by sarl eval
        # private folders that SIGKILLed evals left: of a process gone from this host, of another host
        dead = subprocess.Popen(["true"])
        dead.wait()
        left = [run / f".engine-{socket.gethostname()}-{dead.pid}-k1ll3d", run / ".engine-node7-1-elsewhere"]
        for d in left:
            (d / "endpoints").mkdir(parents=True)
        small = ["--max-tokens", "8", "--max-turns", "2"]
        out = sarl("eval", str(run), "--tasks", "held.jsonl", "-n", "2", "--engine", "own", *small, "--json",
                   cwd=workdir, timeout=900)  # fmt: skip
        assert sorted(run.glob(".engine-*")) == [left[1]]  # the dead one swept, its own cleaned up
        own = json.loads(out.stdout)
        assert own["version"] == 0 and own["engine"] == "own" and own["tasks"] == 3 and own["samples"] == 6
        assert 0.0 <= own["pass@1"] <= 1.0 and own["se@1"] >= 0.0 and "pass@2" in own
        folder = run / "eval" / "v000000" / "held.t0.8-n2.2turns"  # the agent's temperature, 2 samples, 2 turns
        assert own["folder"] == str(folder)
        rows = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
        assert [r["task_id"] for r in rows] == [f"gen/filtering/L1/s2-{i:05d}" for i in range(3)]
        assert all(r["n"] == 2 and sum(r["failures"].values()) == 2 - r["passed"] for r in rows)
        assert json.loads((folder / "summary.json").read_text())["pass@1"] == own["pass@1"]
        # each episode with its outcome and transcript (replies and feedback, not the prompt), to be read
        episodes = [json.loads(x) for x in (folder / "episodes.jsonl").read_text().splitlines()]
        assert [(e["task_id"], e["sample"]) for e in episodes] == [(r["task_id"], i) for r in rows for i in (0, 1)]
        for r in rows:
            mine = [e for e in episodes if e["task_id"] == r["task_id"]]
            assert sum(e["passed"] for e in mine) == r["passed"] and all(
                e["passed"] == (e["failure"] == "") for e in mine
            )
            assert sum(e["turns"] for e in mine) / 2 == r["turns_mean"]
        prompts = {t.task_id: t.prompt for t in read_tasks(workdir / "held.jsonl")}
        assert all(e["transcript"] and prompts[e["task_id"]][:60] not in e["transcript"] for e in episodes)
        # two files, each greedy and sampled: four plays on one engine, loaded once, a summary each in order
        write_tasks(workdir / "other.jsonl", synthesize("filtering", 2, seed=5, difficulty=1))
        out = sarl("eval", str(run), "--tasks", "held.jsonl", "other.jsonl", "-n", "1", "2", "--temperature", "0",
                   "0.8", "--engine", "own", *small, "--json", cwd=workdir, timeout=900)  # fmt: skip
        plays = json.loads(out.stdout)
        assert [(Path(p["tasks_file"]).name, p["n"], p["temperature"], p["tasks"]) for p in plays] == [
            ("held.jsonl", 1, 0.0, 3), ("held.jsonl", 2, 0.8, 3), ("other.jsonl", 1, 0.0, 2), ("other.jsonl", 2, 0.8, 2)
        ]  # fmt: skip
        assert out.stderr.count("Loading weights: 100%") == 1, out.stderr[-3000:]  # one engine start
        again = plays[1]  # the play of the single evaluation above: the same seeds, the same results
        assert again["folder"] == str(folder) and again["pass@1"] == own["pass@1"]
        assert [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()] == rows
        assert len({p["folder"] for p in plays}) == 4 and "pass@2" not in plays[0] and "pass@2" in plays[3]
        # now through the run's generator, live again
        sarl("resume", str(run), cwd=workdir)
        wait_for(lambda: list((run / "endpoints").glob("generator-*.json")), 300, "the live generator")
        out = sarl("eval", str(run), "--tasks", "held.jsonl", "-n", "2", *small, "--json", cwd=workdir, timeout=900)
        live = json.loads(out.stdout)
        assert live["engine"] == "live" and live["pass@1"] == own["pass@1"]  # same engine, same seeds
        bad = sarl("eval", str(run), "--tasks", "held.jsonl", "--version", "3", cwd=workdir, check=False)
        assert bad.returncode == 1 and "--version 3: not in the store" in bad.stderr
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("overlap", "is also in the held-out file"),
        ("k", "eval: k: pass@4 needs 1 <= k <= n = 2"),
        ("missing", "eval.tasks_file"),
    ],
)
def test_bad_eval_section_is_refused_before_submission(workdir: Path, change: str, words: str) -> None:
    from rl.tasks.format import write_tasks
    from rl.tasks.synthesis import synthesize

    tasks = synthesize("parsing", 6, seed=1)
    write_tasks(workdir / "train.jsonl", tasks[:4])
    write_tasks(workdir / "held.jsonl", tasks[3:] if change == "overlap" else tasks[4:])
    held = "nope.jsonl" if change == "missing" else "held.jsonl"
    body = run_config(
        "e",
        executor={"type": "local"},
        model={"dtype": "float32"},
        generator={},
        rollout={"tasks_file": "train.jsonl"},
        eval={"tasks_file": held, "n": 2, "k": [4 if change == "k" else 1]},
    )
    out = sarl("submit", str(write_config(workdir, body)), cwd=workdir, check=False)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert not (workdir / "runs" / "e").exists()


@pytest.mark.slow
def test_the_eval_role_evaluates_version_0_and_every_nth_version_once_with_curves(
    workdir: Path, tiny_model: Path
) -> None:
    """A run with an [eval] section and published versions 1-2 (the tiny
    Llama, HF engine): versions 0 and 2 (every 2) are evaluated, each once,
    with curves per version."""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    from rl.store.weights import WeightStore
    from rl.tasks.format import write_tasks
    from rl.tasks.synthesis import synthesize

    write_tasks(workdir / "held.jsonl", synthesize("arithmetic", 2, seed=4, difficulty=1))
    body = run_config(
        "e",
        executor={"type": "local"},
        model={"path": tiny_model, "dtype": "float32"},
        eval={
            "tasks_file": "held.jsonl",
            "every": 2,
            "n": 2,
            "k": [1, 2],
            "poll_s": 0.5,
            "engine": {"type": "hf", "max_model_len": 512},
            "agent": {"max_turns": 1, "max_tokens": 16},
        },
    )
    run = workdir / "runs" / "e"
    base = load_file(str(tiny_model / "model.safetensors"))
    sarl("submit", str(write_config(workdir, body)), cwd=workdir)
    ws = WeightStore(run / "store.zarr")  # published while the evaluator starts on version 0
    for v in (1, 2):
        torch.manual_seed(v)
        ws.publish({k: t + 0.01 * torch.randn_like(t) for k, t in base.items()}, version=v, dtype="float32")
    try:

        def done() -> bool:
            path = run / "checkpoints" / "eval" / "task-000000.json"
            return path.exists() and bool(task_state(run, 0, "eval").get("done"))

        wait_for(done, 400, "the evaluator")
        state = task_state(run, 0, "eval")
        assert sorted(state["evaluated"]) == ["0", "2"]
        assert all("pass@1" in state["evaluated"][v] and "se@2" in state["evaluated"][v] for v in ("0", "2"))
        for v in (0, 2):
            summary = json.loads((run / "eval" / f"v{v:06d}" / "held.t0.8-n2.1turn" / "summary.json").read_text())
            assert summary["version"] == v and summary["samples"] == 4 and summary["engine"] == "own"
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run / "tb" / "eval"))
        acc.Reload()
        assert [e.step for e in acc.Scalars("eval/pass@1")] == [0, 2]
        assert np.isfinite([e.value for e in acc.Scalars("eval/se@1")]).all()
        glance = json.loads(sarl("status", str(run), "--json", cwd=workdir).stdout)["training"]
        assert glance["last_eval"]["version"] == 2 and "pass@1" in glance["last_eval"]
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)


@pytest.mark.slow
def test_a_terminated_sarl_eval_leaves_no_engine_process_behind(workdir: Path, tiny_model: Path) -> None:
    """`kill` (SIGTERM) of a `sarl eval` that started its own vLLM engine, its
    core in processes of its own (EngineCore and its worker, `engine_core =
    "own-process"`, the default on GPUs), which a
    plain SIGTERM of Python left running, holding their memory. The command
    now exits as on an error, closing what it started: every process under it
    is gone, and it exits with 128 + SIGTERM."""
    import signal
    import subprocess
    import sys

    from rl.tasks.format import write_tasks
    from rl.tasks.synthesis import synthesize

    write_tasks(workdir / "held.jsonl", synthesize("filtering", 40, seed=2, difficulty=1))
    body = run_config(
        "k",
        executor={"type": "local"},
        model={"path": tiny_model, "dtype": "float32"},
        generator={"engine": {"type": "vllm", "max_model_len": 1024, "engine_core": "own-process"}},
    )
    cfg = write_config(workdir, body)
    sarl("submit", str(cfg), cwd=workdir)
    run = workdir / "runs" / "k"
    sarl("cancel", str(run), cwd=workdir)  # the eval starts its own engine
    cmd = [str(Path(sys.executable).with_name("sarl")), "eval", str(run), "--tasks", "held.jsonl", "-n", "4",
           "--engine", "own", "--backend", "vllm", "--max-tokens", "64", "--max-turns", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def descendants() -> set[int]:
        out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
        children: dict[int, list[int]] = {}
        for line in out.splitlines():
            pid, ppid = map(int, line.split())
            children.setdefault(ppid, []).append(pid)
        found, todo = set(), [proc.pid]
        while todo:
            for c in children.get(todo.pop(), []):
                found.add(c)
                todo.append(c)
        return found

    def engine_started() -> set[int] | None:
        if proc.poll() is not None:
            raise AssertionError(f"sarl eval ended before its engine started: {proc.stderr.read()[-2000:]}")
        pids = descendants()
        return pids if any(_comm(p).startswith("VLLM") for p in pids) else None

    pids: set[int] = set()
    try:
        pids = wait_for(engine_started, 600, "sarl eval's vLLM engine processes")
        time.sleep(5.0)  # into the episodes
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(300) == 128 + signal.SIGTERM
        wait_for(lambda: not [p for p in pids if Path(f"/proc/{p}").exists()], 120, "the engine processes to end")
    finally:
        # an orphan's parent is init: the engine processes seen before the kill too (by name: a
        # number may have been reused)
        left = descendants() | {p for p in pids if _comm(p).startswith("VLLM")}
        if proc.poll() is None:
            proc.kill()
        for p in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
