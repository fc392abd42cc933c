"""`sarl bench learn`: what post-training adds, stage by stage, against a
control, on fresh instances of the RL templates and on templates no run
trained on.

It plays the commands a user would type (each in `logs/NN-name.txt`):

1. Sets by role (`sarl tasks sets`, rl.tasks.roles): generated tasks give
   A (the warm start's), U (whole templates no run trains on) and fresh
   candidate instances of every other template.
2. The warm start: `examples/quickstart-sft.toml` on A's references, then
   `sarl export`.
3. B by measurement: the warm start's sampled pass rate on the candidates
   (`sarl eval`, n samples at each of `--temperatures`); RL samples at the
   temperature where the most candidates have signal (samples that
   disagree), and `sarl tasks band` keeps the templates inside the band at
   that temperature as B and draws B', fresh instances of them.
4. The leak checks, both levels, refused on any leak: templates (A + B
   against U) and instances (A + B against B' and U; A against HumanEval).
5. RL from the warm start on B (`examples/quickstart-rl.toml`), and the same
   run with each step's rewards shuffled among its samples (the control:
   same samples, compute and seed).
6. Every stage (base, SFT, SFT + RL, control) evaluated on B' (greedy and
   sampled), U (greedy) and HumanEval (greedy), with differences paired by
   task.

`--quick` shrinks every number so that the chain runs in minutes (its
figures say nothing about learning).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.bench.learn_report import paired_gain, report_lines
from rl.bench.learn_steps import (
    EVAL_KEYS,
    EVALUATED,
    GAINS,
    QUICK_SFT,
    STAGES,
    Steps,
    check_temperatures,
    chosen_temperature,
    count_tasks,
    drop_weights,
    fresh_work,
    leak_counts,
)
from rl.layout import RunLayout

REPO = Path(__file__).resolve().parents[2]
SFT_CONFIG = REPO / "examples" / "quickstart-sft.toml"
RL_CONFIG = REPO / "examples" / "quickstart-rl.toml"

# --quick: every count small, the HF engine (it starts in a second, vLLM in 40)
QUICK_TASKS, QUICK_HELD_OUT = 66, 0.5  # about 20 of the 39 kinds (family and level) on each side
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
QUICK_KEEP = 6
"""--quick: the tasks of each evaluated set kept (enough to run the chain)."""
# one reply of up to 256 tokens, every task at once (the engine's best batch)
FULL_EVAL = ["--max-tokens", "256", "--concurrency", "64"]
QUICK_EVAL = ["--max-tokens", "16", "--backend", "hf"]


SETS = {"instances": "gen.B-fresh.jsonl", "templates": "gen.U.jsonl", "humaneval": "humaneval.jsonl"}
"""Where each stage is measured: B' (fresh instances of the RL templates:
the claim), U (templates no run trained on: no loss of what was not
trained) and HumanEval (all 164; no run trains on them)."""


def bench_learn(args: Any) -> tuple[dict[str, Any], list[str]]:
    from rl.bench.tool_gain import bench_tools, check_options

    check_options(args, args.option_defaults)
    if args.env:  # the tool kinds: rl.bench.tool_gain
        return bench_tools(args)
    t0 = time.perf_counter()
    c = _Chain.start(args)
    r: dict[str, Any] = {"quick": c.quick, "tasks_generated": c.n_tasks, "family": args.family,
                         "model": args.model or "smollm2-135m-instruct", "samples": c.samples,
                         "band_samples": c.band_samples, "evaluate_on": list(args.evaluate_on),
                         "band": list(args.band), "band_by": args.band_by,
                         "sft_set": list(args.sft_set), "rl_set": list(args.rl_set)}  # fmt: skip
    minutes: dict[str, float] = {}
    _make_sets(c)
    _warm_start(c)
    minutes["sft"] = (time.perf_counter() - t0) / 60
    t = time.perf_counter()
    r["temperature"] = _choose_temperature(c)
    r["sets"] = _choose_b(c, r["temperature"])
    minutes["band"] = (time.perf_counter() - t) / 60
    r["leaks"] = _check_leaks(c)
    for name in ("rl", "control"):
        t = time.perf_counter()
        _reinforce(c, name)
        minutes[name] = (time.perf_counter() - t) / 60
    # the RL run's curves with the control's reward beside it: RUN/report/ (control.png, learning.png, ...)
    c.sh("report", "report", str(c.runs["rl"]), "--control", str(c.runs["control"]))
    t = time.perf_counter()
    r["max_turns"] = _max_turns(RunLayout(c.runs["rl"]).config_path)
    r["evals"], r["gains"] = _evaluate(c, r["max_turns"])
    minutes["evals"] = (time.perf_counter() - t) / 60
    minutes["all"] = (time.perf_counter() - t0) / 60
    r["minutes"] = {k: round(v, 2) for k, v in minutes.items()}
    r["folder"], r["runs"] = str(c.work), {k: str(v) for k, v in c.runs.items()}
    if not args.keep:
        drop_weights(c.runs)
    lines = report_lines(r)
    (c.work / "learn.json").write_text(json.dumps(r, indent=1) + "\n")
    (c.work / "learn.txt").write_text("\n".join(lines) + "\n")
    return r, lines


@dataclass
class _Chain:
    """What every phase of one benchmark reads: the options, where its files
    go, and the `sarl` commands' runner."""

    args: Any
    work: Path
    runs: dict[str, Path]
    sh: Steps
    temperature: float = 1.0
    """The temperature RL samples at, once measured (_choose_temperature)."""

    @classmethod
    def start(cls, args: Any) -> _Chain:
        """Refuses a --dir or a run that exists (a run there would be resumed,
        not measured) before anything is made."""
        work = Path(args.dir or "bench-learn").resolve()
        check_temperatures(args)
        runs = _runs(Path(args.runs).resolve() if args.runs else work / "runs")
        return cls(args, work, runs, fresh_work(work, runs))

    @property
    def quick(self) -> bool:
        return bool(self.args.quick)

    @property
    def n_tasks(self) -> int:
        return QUICK_TASKS if self.quick else self.args.tasks

    @property
    def samples(self) -> int:
        return 2 if self.quick else self.args.samples

    @property
    def band_samples(self) -> int:
        return 2 if self.quick else self.args.band_samples

    @property
    def evals_extra(self) -> list[str]:
        return QUICK_EVAL if self.quick else FULL_EVAL

    @property
    def submit(self) -> list[str]:
        """What every run's `sarl submit` starts with after its config."""
        return ["--cluster", "local", "--set", f"run.root={json.dumps(str(self.runs['sft'].parent))}"]


def _make_sets(c: _Chain) -> None:
    """Sets by role: A, U and fresh candidates of every other template."""
    a, held = c.args, (QUICK_HELD_OUT if c.quick else c.args.held_out)
    c.sh("tasks", "tasks", "generate", "--family", a.family, "-n", str(c.n_tasks), "--seed", str(a.seed),
         "-o", "gen.jsonl")  # fmt: skip
    c.sh("sets", "tasks", "sets", "gen.jsonl", "--held-out", str(held), "--new", str(a.new),
         "--candidates", str(1 if c.quick else a.candidates), "--fresh", str(_b_fresh(c)),
         "--seed", str(a.seed))  # fmt: skip
    c.sh("humaneval", "tasks", "import", "humaneval", "-o", "humaneval.jsonl")


def _b_fresh(c: _Chain) -> int:
    """B' instances a kept template: the band draws them, and the sets keep
    out of the candidates a template that has too few left."""
    return 2 if c.quick else int(c.args.fresh)


def _warm_start(c: _Chain) -> None:
    """SFT on A's references, exported as the RL runs' starting model."""
    sft_set = [x for o in (QUICK_SFT if c.quick else []) for x in ("--set", o)]
    if c.args.model:  # another base model than the built-in one
        sft_set += ["--set", f"model.path={json.dumps(str(Path(c.args.model).resolve()))}"]
    sft_set += [x for o in c.args.sft_set for x in ("--set", o)]  # the recipe under measurement
    c.sh.run_to_end("sft", c.runs["sft"], str(SFT_CONFIG), *c.submit, *sft_set,
                    "--set", 'learner.loss.tasks_file="gen.A.jsonl"')  # fmt: skip
    c.sh("export", "export", str(c.runs["sft"]), "-o", str(c.runs["sft"] / "model"), "--json")


def _choose_temperature(c: _Chain) -> dict[str, Any]:
    """The warm start sampled on the candidates at each of --temperatures;
    RL samples at the one where the most tasks have signal (then the lower
    crash share). Returns what each measured, and the choice."""
    from rl.tasks.roles import with_signal

    # the rate of the agent RL will train: its turns, not the SFT run's default
    extra = [*c.evals_extra, "--max-turns", str(_planned_turns(c))]
    measured: dict[str, dict[str, Any]] = {}
    samplings: list[tuple[int, float | None]] = [(c.band_samples, t) for t in c.args.temperatures]
    summaries = c.sh.evals(str(c.runs["sft"]), ["gen.candidates.jsonl"], None, samplings, extra)
    for t, got in zip(c.args.temperatures, summaries, strict=True):
        results = [json.loads(line) for line in (Path(got["folder"]) / "results.jsonl").read_text().splitlines()]
        measured[str(t)] = {"pass@1": got["pass@1"], "crash_share": got["crash_share"], "tasks": got["tasks"],
                            "with_signal": with_signal(results, c.args.band_by), "folder": got["folder"]}  # fmt: skip
    c.temperature = chosen_temperature(measured)
    return {"chosen": c.temperature, "measured": measured}


def _choose_b(c: _Chain, temperature: dict[str, Any]) -> dict[str, int]:
    """B by measurement: the warm start's sampled rate on the candidates at
    the chosen temperature; the templates inside the band are B, and B' is
    drawn for them. Returns each set's size."""
    got = temperature["measured"][str(temperature["chosen"])]
    low, high = (0.0, 1.0) if c.quick else c.args.band  # a tiny model passes nothing: every template is kept
    c.sh("band", "tasks", "band", "gen.candidates.jsonl", "--results", got["folder"], "--band", str(low), str(high),
         "--by", c.args.band_by, "--fresh", str(_b_fresh(c)), "--avoid", "gen.A.jsonl",
         "gen.U.jsonl", "--seed", str(c.args.seed))  # fmt: skip
    if c.quick:  # a few tasks of each evaluated set are enough to run the chain
        for name in SETS.values():
            lines = (c.work / name).read_text().splitlines()[:QUICK_KEEP]
            (c.work / name).write_text("\n".join(lines) + "\n")
    return {name: count_tasks(c.work / f) for name, f in
            (("A", "gen.A.jsonl"), ("B", "gen.B.jsonl"), ("B_fresh", "gen.B-fresh.jsonl"),
             ("U", "gen.U.jsonl"), ("humaneval", "humaneval.jsonl"))}  # fmt: skip


def _check_leaks(c: _Chain) -> dict[str, Any]:
    """Both levels: a held-out set that leaks from a training file measures
    recall, so any leak stops the benchmark."""
    train = ["gen.A.jsonl", "gen.B.jsonl"]
    return {
        "templates": leak_counts(c.sh, "templates", [*train, "gen.U.jsonl"]),
        "instances": {name: leak_counts(c.sh, "instances", [*train, f]) for name, f in SETS.items()},
    }


def _reinforce(c: _Chain, name: str) -> None:
    """RL on B from the warm start ("rl"), or the same run with each step's
    rewards shuffled among its samples ("control")."""
    rl_set = [x for o in (QUICK_RL if c.quick else []) for x in ("--set", o)]
    rl_set += ["--set", f"model.path={json.dumps(str(c.runs['sft'] / 'model'))}",
               "--set", 'rollout.tasks_file=["gen.B.jsonl"]',
               "--set", f"rollout.agent.temperature={c.temperature}"]  # fmt: skip
    rl_set += [x for o in c.args.rl_set for x in ("--set", o)]
    if name == "control":
        rl_set += ["--set", 'run.name="quickstart-rl-control"', "--set", "learner.shuffle_rewards=true"]
    c.sh.run_to_end(name, c.runs[name], str(RL_CONFIG), *c.submit, *rl_set)


def _evaluate(c: _Chain, turns: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every stage on every set, with the turns the RL run played (the agent it
    trained): the cells, and the paired differences between stages."""
    from rl.tasks.format import read_tasks
    from rl.tasks.leakage import template

    extra = [*c.evals_extra, "--max-turns", str(turns)]
    evals: dict[str, Any] = {}
    gains: dict[str, Any] = {}
    # --quick runs the chain; HumanEval is one more set of the same evaluations
    wheres = [w for w in SETS if w in c.args.evaluate_on and not (c.quick and w == "humaneval")]
    modes_of = {w: {"greedy": 1, **({"sampled": c.samples} if w in c.args.sampled_on else {})} for w in wheres}
    # a stage's engine starts once for each way of playing: the sets played greedy and sampled, those greedy alone
    calls: dict[tuple[tuple[str, int], ...], list[str]] = {}
    for w in wheres:
        calls.setdefault(tuple(modes_of[w].items()), []).append(w)
    got: dict[tuple[str, str, str], dict[str, Any]] = {}  # (set, mode, stage) -> summary
    for stage in STAGES:
        run, version = EVALUATED[stage]
        for modes, ws in calls.items():
            samplings: list[tuple[int, float | None]] = [(n, None) for _, n in modes]
            summaries = iter(c.sh.evals(str(c.runs[run]), [SETS[w] for w in ws], version, samplings, extra))
            for w in ws:
                for mode, _ in modes:
                    got[(w, mode, stage)] = next(summaries)
    for where in wheres:
        templates = {t.task_id: template(t) for t in read_tasks(c.work / SETS[where])}
        for mode, n in modes_of[where].items():
            cells = {s: {k: got[(where, mode, s)].get(k) for k in (*EVAL_KEYS, f"pass@{n}", f"se@{n}")} for s in STAGES}
            folders = {s: Path(got[(where, mode, s)]["folder"]) for s in STAGES}
            evals.setdefault(where, {})[mode] = cells
            gains.setdefault(where, {})[mode] = {
                f"{a}_minus_{b}": paired_gain(folders[b], folders[a], templates) for a, b in GAINS
            }
    return evals, gains


def _runs(root: Path) -> dict[str, Path]:
    """The three runs' folders: the warm start, RL from it, and the control."""
    return {"sft": root / "quickstart-sft", "rl": root / "quickstart-rl", "control": root / "quickstart-rl-control"}


def _planned_turns(c: _Chain) -> int:
    """The RL runs' `rollout.agent.max_turns`: the RL config with the
    overrides the benchmark will give it."""
    import tomllib

    from rl.config import parse_overrides

    agent = tomllib.loads(RL_CONFIG.read_text())["rollout"]["agent"]
    over = parse_overrides([*(QUICK_RL if c.quick else []), *c.args.rl_set])
    return int({**agent, **over.get("rollout", {}).get("agent", {})}["max_turns"])


def _max_turns(frozen: Path) -> int:
    """The agent's `max_turns` in a run's frozen config (run.toml)."""
    import tomllib

    return int(tomllib.loads(frozen.read_text())["rollout"]["agent"]["max_turns"])
