"""`sarl bench learn --quick`: the chain end to end (sets by role, the SFT
warm start, export, B by the warm start's measured rate, both leak checks,
RL from the export with all three roles, the shuffled-reward control,
evaluations of every stage on B' (U and HumanEval left out by
--evaluate-on here: the same loop)), on
the tiny model so that it takes minutes.
Whether the chain learns is the full benchmark's business (docs/benchmarks.md)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import SARL, sarl, status, wait_for

from rl.tasks.format import read_tasks
from rl.tasks.leakage import template


@pytest.mark.slow
def test_bench_learn_quick_runs_the_quickstart_chain_and_reports_before_and_after(
    workdir: Path, tiny_model: Path
) -> None:
    # the recipe under measurement: a warm start with repair traces, then agent RL of two turns
    out = sarl("bench", "learn", "--quick", "--json", "--dir", "w", "--model", str(tiny_model),
               "--sft-set", "learner.loss.repairs=0.5", "--rl-set", "rollout.agent.max_turns=2",
               "--temperatures", "0.7", "1.0",
               "--evaluate-on", "instances", "--runs", "r", cwd=workdir, timeout=2400)  # fmt: skip
    r = json.loads(out.stdout)
    assert r["max_turns"] == 2 and r["rl_set"] == ["rollout.agent.max_turns=2"]
    # B' (fresh instances of B's templates) greedy and sampled; U and HumanEval left out by --evaluate-on
    assert r["evaluate_on"] == ["instances"] and r["band_samples"] == 2
    assert {w: sorted(m) for w, m in r["evals"].items()} == {"instances": ["greedy", "sampled"]}
    for where, modes in r["evals"].items():
        for mode, cells in modes.items():
            assert list(cells) == ["base", "sft", "rl", "control"]
            for c in cells.values():
                assert 0.0 <= c["pass@1"] <= 1.0 and 0.0 <= c["crash_share"] <= 1.0 and c["tasks"] == 6
                if mode == "sampled":
                    assert c["pass@1"] <= c["pass@2"] <= 1.0  # n = 2 samples a task under --quick
            gains = r["gains"][where][mode]
            assert list(gains) == ["sft_minus_base", "rl_minus_sft", "rl_minus_control"]
            for name, g in gains.items():
                a, b = name.split("_minus_")
                assert g["se"] >= 0.0 and g["se_templates"] >= 0.0 and 1 <= g["templates"] <= 6
                assert g["points"] == pytest.approx(100 * (cells[a]["pass@1"] - cells[b]["pass@1"]), abs=0.1)
    # the sets by role, each leak-checked at both levels
    assert r["sets"]["A"] > 0 and r["sets"]["B"] > 0 and r["sets"]["B_fresh"] == r["sets"]["U"] == 6
    assert r["leaks"]["templates"]["leaking_held_tasks"] == 0 and r["leaks"]["templates"]["held_tasks"] == 6
    assert sorted(r["leaks"]["instances"]) == ["humaneval", "instances", "templates"]
    assert all(v["leaking_held_tasks"] == 0 for v in r["leaks"]["instances"].values())
    m = r["minutes"]
    assert r["quick"] is True and m["all"] >= m["sft"] + m["band"] + m["rl"] + m["control"] + m["evals"] - 0.05
    w = workdir / "w"
    # the runs went to --runs (the quickstart puts them in runs/), the sets, logs and result to --dir
    sft, rl, control = (workdir / "r" / n for n in ("quickstart-sft", "quickstart-rl", "quickstart-rl-control"))
    assert r["runs"] == {"sft": str(sft), "rl": str(rl), "control": str(control)}
    assert json.loads((w / "learn.json").read_text()) == r
    assert "B' (fresh instances) greedy" in (w / "learn.txt").read_text()
    export = json.loads((sft / "model" / "sarl-export.json").read_text())
    assert export["version"] == 2 and export["run"] == str(sft)  # the warm start's last version
    assert "repairs = 0.5" in (sft / "run.toml").read_text()
    for run in (rl, control):
        frozen = (run / "run.toml").read_text()
        assert str(sft / "model") in frozen and 'mode = "sync"' in frozen  # RL started from the export
        assert "max_turns = 2" in frozen
    # every stage was evaluated as the RL run plays, up to 2 turns: B' greedy and sampled, on one engine
    # start a stage (4 `sarl eval`, not 8)
    evals = [
        p.read_text().splitlines()[0]
        for p in (w / "logs").iterdir()
        if "-eval-" in p.name and "candidates" not in p.name
    ]
    assert len(evals) == 4 and all("--max-turns 2" in e for e in evals), evals
    assert all(" -n 1 2 --temperature 0 1 " in e for e in evals), evals
    # B came from the warm start's measured rate on the candidates, B' is of B's templates
    band = next(p for p in (w / "logs").iterdir() if p.name.endswith("-band.txt")).read_text()
    assert "--results" in band and f"{sft}/eval" in band
    # the band's rate is that of the agent RL trains: its 2 turns (the SFT run's own agent aside),
    # measured at each temperature (one engine start); RL samples at the one where the most candidates had signal
    [measured] = [
        p.read_text().splitlines()[0] for p in (w / "logs").iterdir() if "-eval-" in p.name and "candidates" in p.name
    ]
    assert "--max-turns 2" in measured and " -n 2 2 --temperature 0.7 1.0 " in measured, measured
    temps = r["temperature"]["measured"]
    assert sorted(temps) == ["0.7", "1.0"]
    for x in temps.values():
        assert 0 <= x["with_signal"] <= x["tasks"] and Path(x["folder"]).is_dir()
    chosen = r["temperature"]["chosen"]
    assert max(temps.values(), key=lambda x: (x["with_signal"], -x["crash_share"])) is temps[str(chosen)]
    assert temps[str(chosen)]["folder"] in band  # B is the band at the chosen temperature
    for run in (rl, control):
        agent = tomllib.loads((run / "run.toml").read_text())["rollout"]["agent"]
        assert agent["temperature"] == chosen
    assert f"RL samples at T = {chosen}" in (w / "learn.txt").read_text()
    b_templates = {template(t) for t in read_tasks(w / "gen.B.jsonl")}
    assert {template(t) for t in read_tasks(w / "gen.B-fresh.jsonl")} <= b_templates
    assert "shuffle_rewards = true" in (control / "run.toml").read_text()
    # the RL run's report has the control's reward beside its own
    assert (rl / "report" / "control.png").is_file()
    assert "mean reward over the last 5 learner steps: this run" in (rl / "report" / "summary.txt").read_text()
    assert "shuffle_rewards = true" not in (rl / "run.toml").read_text()
    assert (w / "logs").is_dir() and any("leaks" in p.name for p in (w / "logs").iterdir())  # the leak check ran
    for run in (rl, control):
        state = json.loads((run / "checkpoints" / "learner" / "task-000000.json").read_text())
        assert state["done"] and state["step"] == 2
    # every role of the RL run ended by itself: the generator with the learner and the rollouts
    for role in ("generator", "rollout", "learner"):
        assert json.loads((rl / "checkpoints" / role / "task-000000.json").read_text())["done"], role
    # what an operator sees of the chain: `--wait` into a file writes plain lines with the learner's steps,
    # and `sarl logs` reads every role of the finished RL run, each part under the attempt it comes from
    waited = next(p for p in (w / "logs").iterdir() if p.name.endswith("-wait-rl.txt")).read_text()
    assert "\r" not in waited and re.search(r"  step 2/2\b.*; learner 1 done", waited), waited
    logs = sarl("logs", str(rl), "-n", "3", cwd=workdir).stdout
    for role in ("generator", "rollout", "learner"):
        assert re.search(rf"^==> {role}/0 #1 \(job \d+ on .*\) stderr: ", logs, re.M), (role, logs)
    # the evaluations' per-task results are in the runs
    # greedy and sampled each in a folder of its own (a sampled evaluation once replaced the greedy results)
    for mode in ("greedy.2turns", "t1-n2.2turns"):
        assert (sft / "eval" / "v000000" / f"gen.B-fresh.{mode}" / "results.jsonl").is_file(), mode
    assert not (sft / "store.zarr").exists()  # weights dropped at the end unless --keep
    assert not list((sft / "checkpoints" / "learner").glob("step-*"))


@pytest.mark.slow
def test_a_terminated_bench_learn_cancels_the_run_it_waits_on(workdir: Path, tiny_model: Path) -> None:
    """The runs are detached processes, so a bench that ends early (SIGTERM,
    Ctrl-C) cancels the one it waits on: no role outlives the benchmark. The
    warm start is given far more steps than it can take before the signal."""
    cmd = [*SARL, "bench", "learn", "--quick", "--dir", "w", "--model", str(tiny_model),
           "--sft-set", "learner.steps=100000", "--sft-set", "learner.publish_every=100000"]  # fmt: skip
    bench = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = workdir / "w" / "runs" / "quickstart-sft"
    try:
        learner = wait_for(lambda: run.exists() and _live_learner(run), 600, "the warm start's learner")
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=300)
        assert bench.returncode != 0, err
        detail = status(run)["roles"]["learner"]["detail"][0]
        assert detail["status"] == "CANCELLED" and "sarl cancel" in detail["reason"], detail
        wait_for(lambda: not _alive(learner), 60, "the learner to end")
    finally:
        bench.kill()
        if (run / "run.toml").exists():  # a failed test leaves no learner of 100000 steps behind
            sarl("cancel", str(run), cwd=workdir, check=False)


def test_an_ended_bench_command_takes_the_processes_it_started_with_it(tmp_path: Path) -> None:
    """`sarl eval` starts vLLM engine processes; one that outlived its
    command held cores and memory after the bench had ended. A real command
    here starts a child that nothing but its group's end reaches (SIGTERM
    goes to the command alone): once the command is ended, the child is gone
    too."""
    from rl.bench.learn_steps import _end, _start

    pid_file = tmp_path / "child.pid"
    child = "import time; time.sleep(600)"
    parent = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', {child!r}]); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(600)")  # fmt: skip
    p = _start([sys.executable, "-c", parent], tmp_path)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60, "the child's pid"))
    _end(p, grace_s=2)
    assert p.returncode == -signal.SIGTERM
    wait_for(lambda: not _alive(pid), 30, "the child to end")


def _live_learner(run: Path) -> int | None:
    """The pid of the run's learner once it runs (the local executor's job id)."""
    detail = status(run)["roles"]["learner"]["detail"][0]
    return int(detail["job_id"].split()[1]) if detail["status"] == "RUNNING" else None


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(("env", "run"), [([], "quickstart-rl"), (["--env", "sql"], "tools-rl-control")])
def test_bench_learn_refuses_runs_that_exist_and_leaves_nothing(workdir: Path, env: list[str], run: str) -> None:
    """A run folder already in --runs would be resumed, not measured, and a
    --dir that exists holds another measurement: each is refused before
    anything is made, by both chains (functions, tool kinds)."""
    (workdir / "r" / run).mkdir(parents=True)
    p = sarl("bench", "learn", *env, "--dir", "w", "--runs", "r", cwd=workdir, check=False)
    assert p.returncode != 0 and f"{workdir / 'r' / run} exist" in p.stderr, p.stderr
    assert not (workdir / "w").exists() and sorted(x.name for x in (workdir / "r").iterdir()) == [run]
    (workdir / "old").mkdir()
    p = sarl("bench", "learn", *env, "--dir", "old", "--runs", "r2", cwd=workdir, check=False)
    assert p.returncode != 0 and f"{workdir / 'old'} exists; give a new --dir" in p.stderr, p.stderr
    assert not list((workdir / "old").iterdir()) and not (workdir / "r2").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--temperatures", "0"], "--temperatures 0: greedy samples"),
        (["--temperatures", "1.0", "-1"], "--temperatures -1.0: Input should be greater than or equal to 0"),
        (["--rl-set", "rollout.agent.temperature=0.5"], "give RL's temperature by --temperatures"),
    ],
)
def test_bench_learn_refuses_a_temperature_it_cannot_measure_and_leaves_nothing(
    workdir: Path, args: list[str], words: str
) -> None:
    """RL's temperature is chosen by measuring the band at each one given: a
    greedy one has no signal to measure, and one given by --rl-set would
    sample RL at a temperature the band was not measured at."""
    p = sarl("bench", "learn", "--dir", "w", *args, cwd=workdir, check=False)
    assert p.returncode != 0 and words in p.stderr, p.stderr
    assert not (workdir / "w").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--env", "sql", "--fresh", "3", "--family", "text"], "--family, --fresh: options of the function chain"),
        (["--env", "sql", "--evaluate-on", "instances"], "--evaluate-on: options of the function chain"),
        (["--tool-candidates", "10"], "--tool-candidates is an option of --env"),
        (["--env", "sql", "--temperatures", "0"], "--temperatures 0: greedy samples"),
        (["--env", "sql", "--rl-set", "rollout.agent.temperature=0.5"], "give RL's temperature by --temperatures"),
        (["--env", "sql,bash"], "--env 'sql,bash': tool kinds"),
        # the sampled evaluation beside the greedy one: n = 1 at T = 1 is one draw, not a rate
        (["--samples", "1"], "--samples 1: at least 2"),
        (["--env", "sql", "--samples", "1"], "--samples 1: at least 2"),
        (["--band-samples", "0"], "--band-samples 0: at least 1"),
    ],
)
def test_bench_learn_refuses_an_option_of_the_other_chain_and_leaves_nothing(
    workdir: Path, args: list[str], words: str
) -> None:
    """Each chain takes its own options: one of the other chain would be
    silently ignored, so it is refused before anything is made."""
    p = sarl("bench", "learn", "--dir", "w", *args, cwd=workdir, check=False)
    assert p.returncode != 0 and words in p.stderr, p.stderr
    assert not (workdir / "w").exists()


def test_tasks_with_signal_are_those_whose_samples_disagree() -> None:
    from rl.tasks.roles import with_signal

    rows = [{"n": 4, "passed": k, "reward_mean": k / 4} for k in (0, 1, 3, 4)]
    assert with_signal(rows) == 2
    assert with_signal([*rows, {"n": 4, "passed": 0, "reward_mean": 0.4}], by="reward") == 3


@pytest.mark.slow
def test_bench_learn_quick_on_tool_kinds_runs_the_tool_chain_and_reports_each_kind(
    workdir: Path, tiny_model: Path
) -> None:
    """`--env sql`: tasks held out by database, traces replayed and trained
    on, B by the warm start's rate, RL and its control, then every stage on
    the held-out tasks. The workspace kind runs the same chain with its own
    split (by template: tests/test_leakage.py) and traces (tests/test_traces.py);
    one kind keeps this test to a few minutes."""
    out = sarl("bench", "learn", "--quick", "--json", "--env", "sql", "--dir", "t", "--runs", "r",
               "--temperatures", "0.7", "1.0", "--model", str(tiny_model), cwd=workdir, timeout=2400)  # fmt: skip
    r = json.loads(out.stdout)
    assert r["kinds"] == ["sql"] and r["quick"] is True
    # the band measured at each temperature; RL and its control sample at the one chosen
    assert sorted(r["temperature"]["measured"]) == ["0.7", "1.0"] and r["temperature"]["chosen"] in (0.7, 1.0)
    for t, m in r["temperature"]["measured"].items():
        assert 0 <= m["with_signal"] <= 4 and list(m["kinds"]) == ["sql"], (t, m)
    # both temperatures on one engine start, and each stage once
    evals = [p.read_text().splitlines()[0] for p in (workdir / "t" / "logs").iterdir() if "-eval-" in p.name]
    assert len(evals) == 5 and sum(" -n 2 2 --temperature 0.7 1.0 " in e for e in evals) == 1, evals
    for kind in ("sql",):
        assert r["leaks"][kind]["leaking_held_tasks"] == 0 and r["sets"][kind] == {"train": 4, "heldout": 4}
        assert r["traces"][kind] >= 4  # every training task, some with a repair
        assert r["band_measured"][kind]["candidates"] == 4
        assert sorted(r["valid_calls"][kind]) == ["base", "control", "rl", "sft"]
        assert all(v is None or 0.0 <= v <= 1.0 for v in r["valid_calls"][kind].values())
        assert all(1.0 <= t <= 2.0 for t in r["end_turn"][kind].values())  # --quick: 2 turns at most
        for name in ("sft_minus_base", "rl_minus_sft", "rl_minus_control"):
            g = r["gains"][kind][name]
            a, b = (r["evals"][kind]["greedy"][s]["pass@1"] for s in name.split("_minus_"))
            assert g["se"] >= 0.0 and g["points"] == pytest.approx(100 * (a - b), abs=0.1)
        assert list(r["evals"][kind]) == ["greedy"]  # --quick: the sampled evaluations are the same loop
        assert [c["tasks"] for c in r["evals"][kind]["greedy"].values()] == [4, 4, 4, 4]
    # held out whole: no database of the SQL held-out side is on the training side
    databases = {side: {t.metadata["family"] for t in read_tasks(workdir / "t" / f"sql.{side}.jsonl")}
                 for side in ("train", "heldout")}  # fmt: skip
    assert databases["train"].isdisjoint(databases["heldout"])
    # the warm start trained on traces; RL and the control trained from its export on B
    sft = tomllib.loads((workdir / "r" / "tools-sft" / "run.toml").read_text())
    assert sft["learner"]["loss"]["source"] == "traces"
    for run in ("tools-rl", "tools-rl-control"):
        frozen = tomllib.loads((workdir / "r" / run / "run.toml").read_text())
        assert frozen["rollout"]["tasks_file"] == [str(workdir / "t" / "tools.B.jsonl")]
        assert frozen["model"]["path"] == str(workdir / "r" / "tools-sft" / "model")
        assert frozen["rollout"]["agent"]["temperature"] == r["temperature"]["chosen"]
    assert "valid calls / end turn" in (workdir / "t" / "learn.txt").read_text()
    bad = sarl("bench", "learn", "--quick", "--env", "sql,poetry", "--dir", "u", cwd=workdir, check=False)
    assert bad.returncode != 0 and "--env 'sql,poetry'" in bad.stderr and not (workdir / "u").exists()
