"""`sarl bench learn --env sql,workspace`: agents that use their tools. What
a tool-trace warm start and RL over it add, per kind of tool task, against
a shuffled-reward control, on databases and templates no run trained on.

It plays the commands a user would type (each in `logs/NN-name.txt`):

1. Per kind: `sarl tasks generate`, then `sarl tasks split` holding whole
   units out (SQL: databases, `--by family`; workspace: templates); the
   template leak check must find nothing.
2. Tool traces of the training side (`sarl tasks traces`: each replayed to
   reward 1 in its environment), and the warm start on them
   (`examples/tools-sft.toml`, `source = "traces"`), then `sarl export`.
3. RL's tasks by measurement: the warm start sampled `--band-samples` times
   on `--tool-candidates` training tasks of each kind, at each of
   `--temperatures`; RL samples at the one where the most candidates have
   signal, and the candidates whose pass rate is inside `--band` there are B.
4. RL from the warm start on B (`examples/tools-rl.toml`), and the same run
   with each step's rewards shuffled among its samples (the control).
5. Every stage (base, warm start, RL, control) on each kind's held-out
   tasks, greedy and sampled: the share of valid tool calls, pass@1, and
   the turn at which episodes end, with differences paired by task.

`--quick` shrinks every number and uses the HF engine: the chain runs in
minutes, and its figures say nothing about learning.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from rl.bench.learn_report import paired_gain
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
from rl.errors import SarlError

REPO = Path(__file__).resolve().parents[2]
SFT_CONFIG = REPO / "examples" / "tools-sft.toml"
RL_CONFIG = REPO / "examples" / "tools-rl.toml"
KINDS = {"sql": "family", "workspace": "template"}
TOOL_KEYS = ("tool_valid_share", "tool_calls_per_sample", "tool_error_share")
"""The tool figures of a `sarl eval` summary each stage's cell carries."""
"""Each tool kind, and what its split holds out whole."""

QUICK_KEEP = 4
"""--quick: tasks kept in each kind's training, candidate and held-out files."""
QUICK_RL = [
    "learner.steps=2",
    "learner.samples_per_step=4",
    "learner.micro_batches=1",
    "rollout.groups=2",
    "rollout.groups_per_step=1",
    "rollout.group_size=4",
    "rollout.agent.max_turns=2",
    "rollout.agent.max_tokens=16",
    'generator.engine={type="hf", max_model_len=2048}',
]
QUICK_EVAL = ["--max-tokens", "16", "--backend", "hf", "--max-turns", "2"]


def parse_kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise SarlError(f"bench learn: --env {text!r}: tool kinds, comma-separated, of {', '.join(KINDS)}")
    return list(dict.fromkeys(kinds))


FUNCTION_ONLY = ("tasks", "family", "new", "candidates", "band_by", "fresh", "evaluate_on", "sampled_on")
"""Options of the function chain (its generated sets by role) that --env has
no use for: given with --env, they are refused, not ignored."""


def check_options(args: Any, defaults: dict[str, Any]) -> None:
    """Before anything is made: no option of the other chain. `defaults`:
    each option's default, by its `dest`."""
    if getattr(args, "env", None):
        given = [d for d in FUNCTION_ONLY if getattr(args, d) != defaults[d]]
        if given:
            names = ", ".join("--" + d.replace("_", "-") for d in given)
            raise SarlError(f"bench learn: {names}: options of the function chain; --env measures each kind's own "
                            "held-out tasks (see --tool-candidates, --band, --samples)")  # fmt: skip
    elif args.tool_candidates != defaults["tool_candidates"]:
        raise SarlError("bench learn: --tool-candidates is an option of --env (tool kinds)")
    if args.samples < 2:  # n = 1 at T = 1 would be one draw, read as if it were a rate
        raise SarlError(f"bench learn: --samples {args.samples}: at least 2 (every set is evaluated greedy too)")
    if args.band_samples < 1:
        raise SarlError(f"bench learn: --band-samples {args.band_samples}: at least 1")


def bench_tools(args: Any) -> tuple[dict[str, Any], list[str]]:
    kinds = parse_kinds(args.env)
    check_temperatures(args)
    quick = bool(args.quick)
    work = Path(args.dir or "bench-learn-tools").resolve()
    root = Path(args.runs).resolve() if args.runs else work / "runs"
    runs = {"sft": root / "tools-sft", "rl": root / "tools-rl", "control": root / "tools-rl-control"}
    sh = fresh_work(work, runs)
    submit = ["--cluster", "local", "--set", f"run.root={json.dumps(str(root))}"]
    t0, minutes = time.perf_counter(), {}
    r: dict[str, Any] = {
        "quick": quick,
        "kinds": kinds,
        "band": list(args.band),
        "samples": 2 if quick else args.samples,
    }
    r["sets"], r["leaks"] = _split(sh, kinds, args, quick)
    r["traces"] = _warm_start(sh, kinds, runs, submit, args, quick)
    minutes["sft"] = (time.perf_counter() - t0) / 60
    t = time.perf_counter()
    r["temperature"], r["band_measured"] = _choose_b(sh, kinds, runs, args, quick)
    minutes["band"] = (time.perf_counter() - t) / 60
    for name in ("rl", "control"):
        t = time.perf_counter()
        _reinforce(sh, name, runs, submit, args, quick, r["temperature"]["chosen"])
        minutes[name] = (time.perf_counter() - t) / 60
    t = time.perf_counter()
    r["evals"], r["gains"], r["valid_calls"], r["end_turn"] = _evaluate(sh, kinds, runs, r["samples"], quick)
    minutes["evals"] = (time.perf_counter() - t) / 60
    minutes["all"] = (time.perf_counter() - t0) / 60
    r["minutes"] = {k: round(v, 2) for k, v in minutes.items()}
    r["folder"], r["runs"] = str(work), {k: str(v) for k, v in runs.items()}
    if not args.keep:
        drop_weights(runs)
    lines = report_lines(r)
    (work / "learn.json").write_text(json.dumps(r, indent=1) + "\n")
    (work / "learn.txt").write_text("\n".join(lines) + "\n")
    return r, lines


def _keep(path: Path, n: int) -> None:
    lines = path.read_text().splitlines()[:n]
    path.write_text("\n".join(lines) + "\n")


def _split(sh: Steps, kinds: list[str], args: Any, quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each kind's tasks, split by whole units; the leak check must find nothing."""
    sets, leaks = {}, {}
    for kind in kinds:
        sh(f"tasks-{kind}", "tasks", "generate", "--family", kind, "--seed", str(args.seed), "-o", f"{kind}.jsonl")
        by = ["--by", "family"] if KINDS[kind] == "family" else []
        sh(f"split-{kind}", "tasks", "split", f"{kind}.jsonl", "--held-out", str(args.held_out), "--seed",
           str(args.seed), *by)  # fmt: skip
        if quick:
            for side in ("train", "heldout"):
                _keep(sh.work / f"{kind}.{side}.jsonl", QUICK_KEEP)
        leaks[kind] = leak_counts(sh, "templates", [f"{kind}.train.jsonl", f"{kind}.heldout.jsonl"])
        sets[kind] = {side: count_tasks(sh.work / f"{kind}.{side}.jsonl") for side in ("train", "heldout")}
    return sets, leaks


def _warm_start(
    sh: Steps, kinds: list[str], runs: dict[str, Path], submit: list[str], args: Any, quick: bool
) -> dict[str, int]:
    """Traces of every kind's training side, and SFT on them, exported."""
    counts = {}
    with (sh.work / "tools.traces.jsonl").open("w") as out:
        for kind in kinds:
            model = ["--model", str(Path(args.model).resolve())] if args.model else []
            sh(f"traces-{kind}", "tasks", "traces", f"{kind}.train.jsonl", *model)
            text = (sh.work / f"{kind}.train.traces.jsonl").read_text()
            counts[kind] = len(text.splitlines())
            out.write(text)
    sft_set = [x for o in (QUICK_SFT if quick else []) for x in ("--set", o)]
    if args.model:  # another base model than the built-in one (its tokenizer made the traces)
        sft_set += ["--set", f"model.path={json.dumps(str(Path(args.model).resolve()))}"]
    sft_set += [x for o in args.sft_set for x in ("--set", o)]
    traces = json.dumps(str(sh.work / "tools.traces.jsonl"))
    sh.run_to_end("sft", runs["sft"], str(SFT_CONFIG), *submit, *sft_set, "--set", f"learner.loss.traces_file={traces}")
    sh("export", "export", str(runs["sft"]), "-o", str(runs["sft"] / "model"), "--json")
    return counts


def _choose_b(
    sh: Steps, kinds: list[str], runs: dict[str, Path], args: Any, quick: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """B: the training tasks whose warm-start pass rate (sampled) is inside
    the band, from a seeded draw of candidates of each kind, at the
    temperature of --temperatures where the most candidates have signal
    (then the lower crash share). Returns the temperature's measurements
    and choice, and each kind's candidates and B at it."""
    from rl.tasks.format import read_tasks, write_tasks
    from rl.tasks.roles import with_signal

    low, high = (0.0, 1.0) if quick else args.band  # a quick run passes nothing: every candidate is kept
    for kind in kinds:
        tasks = list(read_tasks(sh.work / f"{kind}.train.jsonl"))
        random.Random(f"{args.seed}/candidates/{kind}").shuffle(tasks)
        write_tasks(sh.work / f"{kind}.candidates.jsonl", tasks[: QUICK_KEEP if quick else args.tool_candidates])
    rates: dict[float, dict[str, dict[str, float]]] = {}
    measured: dict[str, dict[str, Any]] = {}
    n = 2 if quick else args.band_samples
    got_at: dict[tuple[float, str], dict[str, Any]] = {}  # (temperature, kind) -> summary
    for kind in kinds:  # a kind's turns and tokens are its own: an engine start a kind, for every temperature
        extra = QUICK_EVAL if quick else _full_eval(kind)
        samplings: list[tuple[int, float | None]] = [(n, t) for t in args.temperatures]
        summaries = sh.evals(str(runs["sft"]), [f"{kind}.candidates.jsonl"], None, samplings, extra)
        got_at.update({(t, kind): s for t, s in zip(args.temperatures, summaries, strict=True)})
    for t in args.temperatures:
        rates[t], cells = {}, {}
        for kind in kinds:
            got = got_at[(t, kind)]
            rows = [json.loads(x) for x in (Path(got["folder"]) / "results.jsonl").read_text().splitlines() if x]
            rates[t][kind] = {row["task_id"]: row["passed"] / row["n"] for row in rows}
            cells[kind] = {"pass@1": got["pass@1"], "crash_share": got["crash_share"] or 0.0,
                           "with_signal": with_signal(rows), "folder": got["folder"]}  # fmt: skip
        measured[str(t)] = {"with_signal": sum(c["with_signal"] for c in cells.values()),
                            "crash_share": max(c["crash_share"] for c in cells.values()), "kinds": cells}  # fmt: skip
    best = chosen_temperature(measured)
    band, chosen = {}, []
    for kind in kinds:
        rate = rates[best][kind]
        keep = [x for x in read_tasks(sh.work / f"{kind}.candidates.jsonl") if low <= rate[x.task_id] <= high]
        band[kind] = {"candidates": len(rate), "in_band": len(keep),
                      "pass@1": measured[str(best)]["kinds"][kind]["pass@1"]}  # fmt: skip
        chosen += keep
    if not chosen:
        raise SarlError(f"bench learn: no candidate's warm-start pass rate at T = {best} is in [{low}, {high}]: "
                        "no RL tasks")  # fmt: skip
    write_tasks(sh.work / "tools.B.jsonl", chosen)
    return {"chosen": float(best), "measured": measured}, band


def _reinforce(
    sh: Steps, name: str, runs: dict[str, Path], submit: list[str], args: Any, quick: bool, temperature: float
) -> None:
    rl_set = [x for o in (QUICK_RL if quick else []) for x in ("--set", o)]
    rl_set += ["--set", f"model.path={json.dumps(str(runs['sft'] / 'model'))}",
               "--set", f"rollout.tasks_file=[{json.dumps(str(sh.work / 'tools.B.jsonl'))}]",
               "--set", f"rollout.agent.temperature={temperature}"]  # fmt: skip
    rl_set += [x for o in args.rl_set for x in ("--set", o)]
    if name == "control":
        rl_set += ["--set", 'run.name="tools-rl-control"', "--set", "learner.shuffle_rewards=true"]
    sh.run_to_end(name, runs[name], str(RL_CONFIG), *submit, *rl_set)


# Turns and tokens a reply of each kind's evaluation. A workspace episode reads
# the module and its tests, runs them, edits and runs them again: 8 turns hold
# a repair trace. SQL looks, queries and answers (3), with one turn to spare.
# tests/test_traces.py checks each against the longest trace of its kind.
EVAL_TURNS = {"workspace": 8, "sql": 4}
EVAL_TOKENS = {"workspace": 512, "sql": 256}


def _full_eval(kind: str) -> list[str]:
    return ["--concurrency", "32", "--max-tokens", str(EVAL_TOKENS[kind]), "--max-turns", str(EVAL_TURNS[kind])]


def _evaluate(
    sh: Steps, kinds: list[str], runs: dict[str, Path], samples: int, quick: bool
) -> tuple[dict[str, Any], ...]:
    """Every stage on each kind's held-out tasks, greedy and sampled (--quick: greedy)."""
    from rl.tasks.format import read_tasks
    from rl.tasks.leakage import template

    evals: dict[str, Any] = {}
    gains: dict[str, Any] = {}
    valid: dict[str, Any] = {}
    end_turn: dict[str, Any] = {}
    for kind in kinds:
        tasks = f"{kind}.heldout.jsonl"
        templates = {t.task_id: template(t) for t in read_tasks(sh.work / tasks)}
        extra = QUICK_EVAL if quick else _full_eval(kind)
        # --quick: greedy alone (the sampled evaluations are the same loop, at n samples a task)
        modes = {"greedy": 1, **({"sampled": samples} if not quick else {})}
        samplings: list[tuple[int, float | None]] = [(n, None) for n in modes.values()]
        got = {}  # a stage's engine starts once for both modes
        for stage in STAGES:
            run, version = EVALUATED[stage]
            got[stage] = dict(zip(modes, sh.evals(str(runs[run]), [tasks], version, samplings, extra), strict=True))
        for mode in modes:
            folders, cells = {}, {}
            for stage in STAGES:
                e = got[stage][mode]
                folders[stage] = Path(e["folder"])
                cells[stage] = {k: e.get(k) for k in (*EVAL_KEYS, *TOOL_KEYS)}
                rows = [json.loads(x) for x in (folders[stage] / "results.jsonl").read_text().splitlines() if x]
                cells[stage]["end_turn"] = round(sum(row["turns_mean"] for row in rows) / max(1, len(rows)), 2)
            evals.setdefault(kind, {})[mode] = cells
            paired = {f"{a}_minus_{b}": paired_gain(folders[b], folders[a], templates) for a, b in GAINS}
            if mode == "greedy":  # gains.KIND.sft_minus_base: greedy; gains.KIND.sampled.sft_minus_base
                gains[kind] = {**paired, **gains.get(kind, {})}
            else:
                gains.setdefault(kind, {})["sampled"] = paired
        valid[kind] = {s: evals[kind]["greedy"][s]["tool_valid_share"] for s in STAGES}
        end_turn[kind] = {s: evals[kind]["greedy"][s]["end_turn"] for s in STAGES}
    return evals, gains, valid, end_turn


def report_lines(r: dict[str, Any]) -> list[str]:
    m = r["minutes"]
    out = [
        f"learn --env {','.join(r['kinds'])}: the tool kinds' held-out tasks by stage, {m['all']:.1f} min in all "
        f"(warm start {m['sft']:.1f}, band {m['band']:.1f}, RL {m['rl']:.1f}, control {m['control']:.1f}, "
        f"evaluations {m['evals']:.1f})" + (" [--quick: not a measurement]" if r["quick"] else ""),
        "  sets: "
        + "; ".join(
            f"{k} train {v['train']}, held out {v['heldout']} (leaks {r['leaks'][k]['leaking_held_tasks']})"
            for k, v in r["sets"].items()
        ),  # fmt: skip
        "  traces: "
        + ", ".join(f"{k} {n}" for k, n in r["traces"].items())
        + f"; RL samples at T = {r['temperature']['chosen']} ("
        + ", ".join(f"T = {t}: {x['with_signal']} with signal" for t, x in r["temperature"]["measured"].items())
        + f"); B (warm-start rate in [{r['band'][0]}, {r['band'][1]}]): "
        + ", ".join(f"{k} {x['in_band']} of {x['candidates']}" for k, x in r["band_measured"].items()),
        f"  {'':<28}" + "".join(f"{s:>16}" for s in ("base", "warm start", "+ RL", "control")),
    ]
    for kind, modes in r["evals"].items():
        for mode, cells in modes.items():
            out.append(f"  {kind + ' ' + mode + ' pass@1':<28}" + "".join(
                f"{c['pass@1']:.3f} +- {c['se@1']:.3f}".rjust(16) for c in cells.values()))  # fmt: skip
            out.append(f"  {'  valid calls / end turn':<28}" + "".join(
                (f"{100 * (c['tool_valid_share'] or 0):.0f}% / {c['end_turn']:.1f}").rjust(16)
                for c in cells.values()))  # fmt: skip
            gains = r["gains"][kind] if mode == "greedy" else r["gains"][kind]["sampled"]
            out.append("    " + "   ".join(
                f"{k.replace('_minus_', ' - ')} {gains[k]['points']:+.1f} +- {gains[k]['se']:.1f}"
                for k in (f"{a}_minus_{b}" for a, b in GAINS)))  # fmt: skip
    out.append("  targets: the warm start >= 90% valid calls and pass@1 above base by >= 2 paired se on each kind; "
               "rl - control >= 2 se")  # fmt: skip
    out.append(f"  runs, logs and TensorBoard: {r['folder']}")
    return out
