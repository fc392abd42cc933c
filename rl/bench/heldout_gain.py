"""`sarl bench learn`: what the quickstart's post-training adds, stage by
stage, on tasks no run trained on, against a control.

It plays scripts/quickstart.sh's commands with its two configs: generated
tasks split into train and held-out by whole templates, refused if the
held-out tasks (or HumanEval's) leak from the training ones (`sarl tasks
leaks`); `examples/quickstart-sft.toml`, a warm start on the training tasks'
references; `sarl export`; `examples/quickstart-rl.toml`, RL from the warm
start on the same training tasks; and the same RL run again with each
step's rewards shuffled among its samples (`learner.shuffle_rewards`: same
samples, compute and seed), the control. Pass@1 (greedy, one sample per
task) of the base model, the warm start, SFT + RL and the control is
measured on the generated held-out tasks and on all 164 HumanEval
problems, with the differences between stages paired by task.

Every step is the `sarl` command a user would type, in a folder of its own,
with its output in `logs/`. `--quick` shrinks every number so that the whole
chain runs in minutes (its figures say nothing about learning).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rl.errors import SarlError

REPO = Path(__file__).resolve().parents[2]
SFT_CONFIG = REPO / "examples" / "quickstart-sft.toml"
RL_CONFIG = REPO / "examples" / "quickstart-rl.toml"

# --quick: every count small, the HF engine (it starts in a second, vLLM in 40)
QUICK_TASKS, QUICK_HELD_OUT = 66, 0.5  # about 20 of the 39 kinds (family and level) on each side
QUICK_SFT = ["learner.steps=2", "learner.samples_per_step=4", "learner.micro_batches=1", "learner.publish_every=1"]
QUICK_RL = [
    "learner.steps=2",
    "learner.samples_per_step=4",
    "learner.micro_batches=1",
    "rollout.groups=2",
    "rollout.groups_per_step=1",
    "rollout.group_size=4",
    "rollout.agent.max_turns=1",
    "rollout.agent.max_tokens=16",
    'generator.engine={type="hf", max_model_len=1024}',
]
# greedy, one reply of up to 256 tokens, every task at once (the engine's best batch)
FULL_EVAL = ["--max-tokens", "256", "--concurrency", "64"]
QUICK_EVAL = ["--max-tokens", "16", "--backend", "hf"]


class _Steps:
    """Runs `sarl` commands in `work`, each one's output in logs/NN-name.txt."""

    def __init__(self, work: Path):
        self.work, self.n = work, 0
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.sarl = str(Path(sys.executable).with_name("sarl"))

    def __call__(self, name: str, *args: str) -> str:
        self.n += 1
        log = self.work / "logs" / f"{self.n:02d}-{name}.txt"
        print(f"bench learn: sarl {' '.join(args)}", file=sys.stderr, flush=True)
        p = subprocess.run([self.sarl, *args], cwd=self.work, capture_output=True, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        log.write_text(f"$ sarl {' '.join(args)}\n{p.stdout}\n--- stderr\n{p.stderr}")
        if p.returncode != 0:
            tail = "\n".join((p.stderr.strip() or p.stdout.strip()).splitlines()[-15:])
            raise SarlError(f"bench learn: `sarl {' '.join(args)}` failed ({log}):\n{tail}")
        return p.stdout

    def eval(self, run: str, tasks: str, version: int | None, extra: list[str]) -> dict[str, Any]:
        args = ["eval", run, "--tasks", tasks, "--temperature", "0", "-n", "1", "--json", *extra]
        if version is not None:
            args += ["--version", str(version)]
        return json.loads(self(f"eval-{Path(run).name}-{Path(tasks).stem}", *args))


STAGES = ("base", "sft", "rl", "control")
"""What is evaluated: the base model, the SFT warm start, SFT + RL, and SFT +
RL with each step's rewards shuffled among its samples (the control)."""
GAINS = (("sft", "base"), ("rl", "sft"), ("rl", "control"))
"""The paired differences reported: what the warm start gave, what RL gave
on top of it, and what RL gave beyond the same updates on shuffled rewards."""


def bench_learn(args: Any) -> tuple[dict[str, Any], list[str]]:
    t0 = time.perf_counter()
    work = Path(args.dir or "bench-learn").resolve()
    if work.exists():
        raise SarlError(f"bench learn: {work} exists; give a new --dir")
    work.mkdir(parents=True)
    sh = _Steps(work)
    quick = bool(args.quick)
    n_tasks, held = (QUICK_TASKS, QUICK_HELD_OUT) if quick else (args.tasks, args.held_out)
    sh("tasks", "tasks", "generate", "--family", args.family, "-n", str(n_tasks), "--seed", str(args.seed),
       "-o", "gen.jsonl")  # fmt: skip
    sh("split", "tasks", "split", "gen.jsonl", "--held-out", str(held), "--seed", str(args.seed))
    sh("humaneval", "tasks", "import", "humaneval", "-o", "humaneval.jsonl")  # all 164: no run trains on them
    # a held-out set that leaks from the training tasks measures recall: refused (the report is in logs/)
    sh("leaks", "tasks", "leaks", "gen.train.jsonl", "gen.heldout.jsonl")
    sh("leaks-humaneval", "tasks", "leaks", "gen.train.jsonl", "humaneval.jsonl")
    if quick:  # a few held-out tasks are enough to run the chain
        for name in ("gen.heldout.jsonl", "humaneval.jsonl"):
            lines = (work / name).read_text().splitlines()[:6]
            (work / name).write_text("\n".join(lines) + "\n")

    common = ["--cluster", "local", "--set", 'run.root="runs"']
    sft_set = [x for o in (QUICK_SFT if quick else []) for x in ("--set", o)]
    if args.model:  # another base model than the built-in one
        sft_set += ["--set", f"model.path={json.dumps(str(Path(args.model).resolve()))}"]
    sft_set += [x for o in args.sft_set for x in ("--set", o)]  # the recipe under measurement
    sh("submit-sft", "submit", str(SFT_CONFIG), *common, *sft_set,
       "--set", 'learner.loss.tasks_file="gen.train.jsonl"')  # fmt: skip
    sh("wait-sft", "status", "runs/quickstart-sft", "--wait")
    sh("export", "export", "runs/quickstart-sft", "-o", "runs/quickstart-sft/model", "--json")
    minutes = {"sft": (time.perf_counter() - t0) / 60}
    rl_set = [x for o in (QUICK_RL if quick else []) for x in ("--set", o)]
    rl_set += ["--set", 'model.path="runs/quickstart-sft/model"', "--set", 'rollout.tasks_file=["gen.train.jsonl"]']
    rl_set += [x for o in args.rl_set for x in ("--set", o)]
    for name, extra in (("rl", []), ("control", ["--set", 'run.name="quickstart-rl-control"',
                                                  "--set", "learner.shuffle_rewards=true"])):  # fmt: skip
        t = time.perf_counter()
        sh(f"submit-{name}", "submit", str(RL_CONFIG), *common, *rl_set, *extra)
        sh(f"wait-{name}", "status", RUNS[name], "--wait")
        minutes[name] = (time.perf_counter() - t) / 60
    # the RL run's curves with the control's reward beside it: RUN/report/ (control.png, learning.png, ...)
    sh("report", "report", RUNS["rl"], "--control", RUNS["control"])

    # every stage is evaluated with the turns the RL run played (the agent it trained), greedy
    turns = _max_turns(work / RUNS["rl"] / "run.toml")
    evals = [*(QUICK_EVAL if quick else FULL_EVAL), "--max-turns", str(turns)]
    r: dict[str, Any] = {"quick": quick, "tasks_generated": n_tasks, "family": args.family,
                         "model": args.model or "smollm2-135m-instruct", "max_turns": turns,
                         "sft_set": list(args.sft_set), "rl_set": list(args.rl_set)}  # fmt: skip
    for key, tasks in (("", "gen.heldout.jsonl"), ("humaneval_", "humaneval.jsonl")):
        folders = {}
        for stage in STAGES:
            run, version = EVALUATED[stage]
            got = sh.eval(run, tasks, version, evals)
            r[f"{key}pass1_{stage}"], r[f"{key}se_{stage}"] = got["pass@1"], got["se@1"]
            for k in ("crash_share", "turn_2_share", "turn_2_fix_rate"):
                r[f"{key}{k}_{stage}"] = got.get(k)
            folders[stage] = Path(got["folder"])
            r[f"{key}tasks"] = got["tasks"]
        for a, b in GAINS:
            r[f"{key}gain_{a}_vs_{b}"], r[f"{key}gain_{a}_vs_{b}_se"] = _paired_gain(folders[b], folders[a])
    r.update({f"minutes_{k}": v for k, v in minutes.items()})
    r["minutes"] = (time.perf_counter() - t0) / 60  # the evaluations included
    r["folder"] = str(work)
    r = {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
    if not args.keep:
        for run in RUNS.values():  # the weights and checkpoints: GBs
            shutil.rmtree(work / run / "store.zarr", ignore_errors=True)
            for step in (work / run / "checkpoints" / "learner").glob("step-*"):  # not the role state
                shutil.rmtree(step, ignore_errors=True)
    return r, _lines(r)


RUNS = {"sft": "runs/quickstart-sft", "rl": "runs/quickstart-rl", "control": "runs/quickstart-rl-control"}
EVALUATED: dict[str, tuple[str, int | None]] = {
    "base": (RUNS["sft"], 0),  # the SFT run's version 0: the base model
    "sft": (RUNS["rl"], 0),  # the RL run's version 0: the exported warm start it began from
    "rl": (RUNS["rl"], None),  # the newest version
    "control": (RUNS["control"], None),
}


def _max_turns(frozen: Path) -> int:
    """The agent's `max_turns` in a run's frozen config (run.toml)."""
    import tomllib

    return int(tomllib.loads(frozen.read_text())["rollout"]["agent"]["max_turns"])


def _paired_gain(before: Path, after: Path) -> tuple[float, float]:
    """Mean and standard error of the per-task change of pass@1: both
    evaluations ran on the same tasks, so the pairing removes the spread
    of task difficulty from the error."""
    from rl.eval.passk import mean_and_se

    def per_task(folder: Path) -> dict[str, float]:
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line]
        return {r["task_id"]: r["pass_at"]["pass@1"] for r in rows}

    b, a = per_task(before), per_task(after)
    return mean_and_se([a[t] - b[t] for t in sorted(b.keys() & a.keys())])


def _lines(r: dict[str, Any]) -> list[str]:
    def row(name: str, key: str) -> str:
        cells = [f"{r[f'{key}pass1_{s}']:.3f} +- {r[f'{key}se_{s}']:.3f}" for s in STAGES]
        return f"  {name:<18}" + "".join(f"{c:>16}" for c in cells)

    def shares(key: str) -> str:
        def pct(v: Any) -> str:
            return "-" if v is None else f"{100 * v:.0f}%"

        cells = [f"{pct(r.get(f'{key}crash_share_{s}'))} / {pct(r.get(f'{key}turn_2_share_{s}'))}" for s in STAGES]
        return f"  {'crash / turn 2':<18}" + "".join(f"{c:>16}" for c in cells)

    def gains(key: str) -> str:
        return "  " + "   ".join(
            f"{a} - {b} {r[f'{key}gain_{a}_vs_{b}'] * 100:+.1f} +- {r[f'{key}gain_{a}_vs_{b}_se'] * 100:.1f}"
            for a, b in GAINS
        )

    return [
        f"learn: held-out pass@1 (greedy, up to {r['max_turns']} turns, paired standard errors in points), "
        f"{r['minutes']:.1f} min in all "
        f"(SFT {r['minutes_sft']:.1f}, RL {r['minutes_rl']:.1f}, control {r['minutes_control']:.1f})"
        + (" [--quick: not a measurement]" if r["quick"] else ""),
        f"  {'':<18}" + "".join(f"{s:>16}" for s in ("base", "SFT", "SFT + RL", "control")),
        row(f"generated ({r['tasks']})", ""),
        shares(""),
        gains("") + "   (targets: rl - sft >= +5 points and >= 2 se; rl - control >= 2 se)",
        row(f"HumanEval ({r['humaneval_tasks']})", "humaneval_"),
        shares("humaneval_"),
        gains("humaneval_") + "   (target: rl - sft not below -1 se)",
        f"  runs, logs and TensorBoard: {r['folder']}",
    ]
