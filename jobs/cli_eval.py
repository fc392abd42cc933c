"""`sarl eval RUN_DIR --tasks FILE`: pass@1 and pass@k of one weight version
(rl.eval.run), with standard errors; per-task results in the run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    q = sub.add_parser("eval", help="pass@1 and pass@k of a weight version on a task file, with standard errors")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("--tasks", type=Path, required=True, metavar="FILE", help="task file (JSONL) to evaluate on")
    q.add_argument("--version", type=int, default=None, help="weight version (default: the newest; 0: the base)")
    q.add_argument("-n", type=int, default=1, help="samples per task (pass@k needs k <= n)")
    q.add_argument("-k", type=int, nargs="*", default=None, help="the k of pass@k (default: 1 and n)")
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
        help="the engine of its own (default: the run's generator engine, else vllm); hf starts in seconds",
    )
    q.add_argument("--max-tokens", type=int, help="tokens per reply (default: the run's agent)")
    q.add_argument("--max-turns", type=int, help="replies per episode (default: the run's agent)")
    q.add_argument("--temperature", type=float, help="sampling temperature (default: the run's agent)")
    q.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    q.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from jobs.cli_run import run_dir
    from jobs.output import emit_json
    from rl.engine.config import HFEngineConfig, VLLMEngineConfig
    from rl.errors import SarlError
    from rl.eval.run import Plan, evaluate, with_changes
    from rl.run.role import context_of
    from rl.tasks.format import read_tasks

    rd = run_dir(args.run_dir)
    cfg = rd.config()
    if args.n < 1:
        raise SarlError(f"-n {args.n}: at least one sample per task")
    ks = args.k if args.k else sorted({1, args.n})
    bad = [k for k in ks if not 1 <= k <= args.n]
    if bad:
        raise SarlError(f"-k {bad[0]}: pass@k needs 1 <= k <= n = {args.n}")
    tasks = list(read_tasks(args.tasks))
    if not tasks:
        raise SarlError(f"{args.tasks}: no task")
    changes = {"max_tokens": args.max_tokens, "max_turns": args.max_turns, "temperature": args.temperature}
    agent = cfg.eval.agent if cfg.eval is not None and cfg.eval.agent is not None else cfg.agent()
    agent = with_changes(agent, {k: v for k, v in changes.items() if v is not None})
    own = {"hf": HFEngineConfig(), "vllm": VLLMEngineConfig()}.get(args.backend) or cfg.engine()
    live_max_len = cfg.generator.engine.max_model_len if cfg.generator is not None else None
    plan = Plan(tasks, str(args.tasks), agent, args.n, ks, args.concurrency)
    bar = tqdm(total=len(tasks) * args.n, desc="eval", unit="episode", file=sys.stderr)
    summary = evaluate(context_of(cfg, rd.path), plan, args.version, args.engine, own, live_max_len, bar.update)
    bar.close()
    if args.json:
        emit_json(summary)
        return 0
    how = f"{summary['engine']} engine, {summary['minutes']} min"
    print(f"version {summary['version']} on {summary['tasks']} tasks of {args.tasks}, {args.n} sample(s) each ({how})")
    for k in ks:
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
    return 0
