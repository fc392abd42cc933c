"""`sarl verify TASKS SAMPLES`: verify HumanEval-style samples in sandboxes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    q = sub.add_parser(
        "verify", help="verify HumanEval-style samples in sandboxes; write per-sample results; print a JSON summary"
    )
    q.add_argument("tasks", type=Path, metavar="TASKS.jsonl")
    q.add_argument("samples", type=Path, metavar="SAMPLES.jsonl")
    q.add_argument("-o", "--output", type=Path, help="results (default: SAMPLES_results.jsonl)")
    q.add_argument("--audit", type=Path, help="audit log (default: RESULTS.audit.jsonl)")
    q.add_argument(
        "--config", type=Path, metavar="RUN.toml", help="take [verify] weights and [sandbox] from a run config"
    )
    q.set_defaults(handler=verify, json=True)


def verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from jobs.output import emit_json
    from rl.fsio import atomic_write
    from rl.tasks.format import TaskError, read_samples, read_tasks
    from rl.verify.verifier import Verifier

    tasks = {t.task_id: t for t in read_tasks(args.tasks)}
    jobs = []
    for n, s in read_samples(args.samples):
        if s["task_id"] not in tasks:
            raise TaskError(f"{args.samples}:{n}: task_id: {s['task_id']!r} is not in {args.tasks}")
        jobs.append((tasks[s["task_id"]], s["completion"]))
    vcfg, scfg = None, None
    if args.config is not None:  # [verify] weights and gates, [sandbox] backend and limits
        from rl.config import load_config

        run_cfg = load_config(args.config, cluster="local")
        vcfg, scfg = run_cfg.verify, run_cfg.sandbox
    out = args.output or Path(str(args.samples) + "_results.jsonl")
    audit = args.audit or Path(str(out) + ".audit.jsonl")
    bar = tqdm(total=len(jobs), desc="verify", unit="sample", file=sys.stderr)
    with Verifier(vcfg, sandbox=scfg, audit=audit) as verifier:
        verdicts = verifier.verify_many(jobs, progress=bar)
    bar.close()
    lines = [
        json.dumps(
            {"task_id": v.task_id, "reward": v.reward, "checks": v.checks, "passed": v.passed, "failure": v.failure}
        )
        for v in verdicts
    ]
    passed = sum(v.passed for v in verdicts)
    summary = {
        "summary": True,
        "samples": len(verdicts),
        "passed": passed,
        "pass_rate": round(passed / len(verdicts), 4) if verdicts else 0.0,
        "mean_reward": round(sum(v.reward for v in verdicts) / len(verdicts), 4) if verdicts else 0.0,
    }
    atomic_write(out, "\n".join(lines + [json.dumps(summary)]) + "\n")
    emit_json(summary)
    print(f"results -> {out}; audit log -> {audit}", file=sys.stderr)
    return 0
