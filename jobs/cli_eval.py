"""`sarl eval RUN_DIR --tasks FILE...`: pass@1 and pass@k of one weight
version (rl.eval.run), with standard errors; per-task results in the run
directory. Several files, and several samplings (`-n 1 8 --temperature 0
1`: greedy, then 8 samples at T = 1), are played one after another on one
engine: each pair of a file and a sampling is a play, with its own summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    q = sub.add_parser("eval", help="pass@1 and pass@k of a weight version on a task file, with standard errors")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("--tasks", type=Path, nargs="+", required=True, metavar="FILE",
                   help="task files (JSONL) to evaluate on, each with every sampling, on one engine")  # fmt: skip
    q.add_argument("--version", type=int, default=None, help="weight version (default: the newest; 0: the base)")
    q.add_argument("-n", type=int, nargs="+", default=[1], metavar="N",
                   help="samples per task; several, each with its --temperature, are played in turn "
                   "(-n 1 8 --temperature 0 1: greedy, then 8 samples at T = 1)")  # fmt: skip
    q.add_argument("-k", type=int, nargs="*", default=None,
                   help="the k of pass@k, each reported where k <= n (default: 1 and n)")  # fmt: skip
    q.add_argument("--concurrency", type=int, default=8, help="episodes at once")
    q.add_argument(
        "--engine",
        choices=("auto", "live", "own"),
        default="auto",
        help="live: the run's generators (they must serve the version); own: start an engine here; "
        "auto: live when they serve the version, else own",
    )
    q.add_argument(
        "--backend",
        choices=("vllm", "hf"),
        help="the engine of its own: the run's generator engine, with its settings, when it is of this "
        "backend, else this backend's defaults (default: the run's engine, else vllm); hf starts in seconds",
    )
    q.add_argument("--max-tokens", type=int, help="tokens per reply (default: the run's agent)")
    q.add_argument("--max-turns", type=int, help="replies per episode (default: the run's agent)")
    q.add_argument("--temperature", type=float, nargs="+", metavar="T",
                   help="sampling temperature, one for every -n or one for all (default: the run's agent)")  # fmt: skip
    q.add_argument("--json", action="store_true",
                   help="print the summary as one JSON object; several plays: a list of them, in order "
                   "(each file with each sampling in turn)")  # fmt: skip
    q.set_defaults(handler=run)


def samplings(ns: list[int], temperatures: list[float] | None) -> list[tuple[int, float | None]]:
    """-n and --temperature paired: (samples a task, temperature or None for
    the run's agent's), in order. A single value of either goes with every
    value of the other."""
    from rl.errors import ConfigError

    ts: list[float | None] = list(temperatures) if temperatures else [None]
    if len(ns) > 1 and len(ts) > 1 and len(ns) != len(ts):
        raise ConfigError(f"-n {' '.join(map(str, ns))} and --temperature {' '.join(map(str, ts))}: "
                        "give as many of one as of the other, or a single value of either")  # fmt: skip
    width = max(len(ns), len(ts))
    pairs = list(zip(ns * width if len(ns) == 1 else ns, ts * width if len(ts) == 1 else ts, strict=True))
    for n, _ in pairs:
        if n < 1:
            raise ConfigError(f"-n {n}: at least one sample per task")
    if len(set(pairs)) < len(pairs):
        raise ConfigError(f"-n {' '.join(map(str, ns))} --temperature {' '.join(map(str, ts))}: "
                        "a sampling given twice")  # fmt: skip
    return pairs


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from jobs.cli_run import run_dir
    from jobs.output import emit_json
    from rl.engine.config import HFEngineConfig, VLLMEngineConfig
    from rl.errors import ConfigError, SarlError
    from rl.eval.run import Plan, evaluate, with_changes
    from rl.run.role import context_of
    from rl.tasks.format import read_tasks

    rd = run_dir(args.run_dir)
    cfg = rd.config()
    pairs = samplings(args.n, args.temperature)
    top = max(n for n, _ in pairs)
    bad = [k for k in args.k or [] if not 1 <= k <= top]
    if bad:
        raise ConfigError(f"-k {bad[0]}: pass@k needs 1 <= k <= n = {top}")
    files = [f.resolve() for f in args.tasks]
    twice = sorted({str(a) for a, f in zip(args.tasks, files, strict=True) if files.count(f) > 1})
    if twice:
        raise ConfigError(f"--tasks {twice[0]}: given twice")
    agent = cfg.eval.agent if cfg.eval is not None and cfg.eval.agent is not None else cfg.agent()
    plans = []
    for path in args.tasks:  # every file read and every sampling checked before an engine starts
        tasks = list(read_tasks(path))
        if not tasks:
            raise SarlError(f"{path}: no task")
        for n, t in pairs:
            changes = {"max_tokens": args.max_tokens, "max_turns": args.max_turns, "temperature": t}
            played = with_changes(agent, {k: v for k, v in changes.items() if v is not None})
            ks = sorted({k for k in args.k if k <= n}) if args.k else sorted({1, n})
            plans.append(Plan(tasks, str(path), played, n, ks or [1], args.concurrency))
    own = cfg.engine()  # the run's engine, with its settings; another backend at its defaults
    if args.backend not in (None, own.type):
        own = {"hf": HFEngineConfig(), "vllm": VLLMEngineConfig()}[args.backend]
    live_max_len = cfg.generator.engine.max_model_len if cfg.generator is not None else None
    bar = tqdm(total=sum(len(p.tasks) * p.n for p in plans), desc="eval", unit="episode", file=sys.stderr)
    summaries = evaluate(context_of(cfg, rd.path), plans, args.version, args.engine, own, live_max_len, bar.update)
    bar.close()
    if args.json:  # one document: a play's summary, or the list of them in order
        emit_json(summaries[0] if len(summaries) == 1 else summaries)
        return 0
    for plan, summary in zip(plans, summaries, strict=True):
        _print_summary(summary, plan)
    return 0


def _print_summary(summary: dict[str, Any], plan: Any) -> None:
    how = f"{summary['engine']} engine, {summary['minutes']} min"
    at = "greedy" if summary["temperature"] == 0 and plan.n == 1 else f"T = {summary['temperature']:g}"
    print(f"version {summary['version']} on {summary['tasks']} tasks of {plan.tasks_name}, "
          f"{plan.n} sample(s) each, {at} ({how})")  # fmt: skip
    for k in plan.ks:
        print(f"  pass@{k} = {summary[f'pass@{k}']:.3f} +- {summary[f'se@{k}']:.3f} (standard error)")
    if "tool_valid_share" in summary:
        print(
            f"  tool calls: {summary['tool_calls_per_sample']} per sample, "
            f"{summary['tool_valid_share']:.1%} of them valid, "
            f"{summary['tool_error_share']:.1%} answered with an error (an edit not applied, a SQL error)"
        )
    if summary["failures"]:
        print("  failures: " + ", ".join(f"{why} {n}" for why, n in summary["failures"].items()))
    print(f"  results: {summary['folder']}")
