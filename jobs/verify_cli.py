"""`sarl tasks ...` and `sarl verify`: task files, their validation, and
verification of samples. Imported only when one of these commands runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def tasks_main(args: argparse.Namespace) -> int:
    from rl.tasks import TaskError, import_humaneval, read_tasks, write_tasks

    if args.tasks_cmd == "import":
        tasks = import_humaneval()
        write_tasks(args.output, tasks)
        print(f"wrote {len(tasks)} tasks to {args.output}", file=sys.stderr)
        return 0
    if args.tasks_cmd == "validate":
        from tqdm import tqdm

        from rl.taskpool import report_json, validate
        from rl.verify import Verifier

        try:
            tasks = list(read_tasks(args.file))
        except TaskError as e:
            print(f"sarl tasks validate: {e}", file=sys.stderr)
            return 2
        clean = args.output or args.file.with_name(args.file.name.removesuffix(".jsonl") + ".clean.jsonl")
        report_path = args.report or args.file.with_name(args.file.name.removesuffix(".jsonl") + ".report.json")
        bar = tqdm(total=len(tasks), desc="validate", unit="task", file=sys.stderr)
        with Verifier() as verifier:
            reports = validate(tasks, verifier, repeats=args.repeats, progress=bar.update)
        bar.close()
        from rl.rundir import atomic_write

        atomic_write(report_path, json.dumps(report_json(reports), indent=1) + "\n")
        ok = {r.task_id for r in reports if r.ok}
        write_tasks(clean, [t for t in tasks if t.task_id in ok])
        for r in reports:
            if not r.ok:
                print(f"{r.task_id}: " + "; ".join(r.problems))
        print(f"{len(ok)} of {len(tasks)} tasks are clean -> {clean}; report -> {report_path}", file=sys.stderr)
        return 0
    raise AssertionError(args.tasks_cmd)


def verify_main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rl.tasks import TaskError, read_samples, read_tasks
    from rl.verify import Verifier

    try:
        tasks = {t.task_id: t for t in read_tasks(args.tasks)}
        jobs = []
        for n, s in read_samples(args.samples):
            if s["task_id"] not in tasks:
                raise TaskError(f"{args.samples}:{n}: task_id: {s['task_id']!r} is not in {args.tasks}")
            jobs.append((tasks[s["task_id"]], s["completion"]))
    except TaskError as e:
        print(f"sarl verify: {e}", file=sys.stderr)
        return 2
    out = args.output or Path(str(args.samples) + "_results.jsonl")
    audit = args.audit or Path(str(out) + ".audit.jsonl")
    bar = tqdm(total=len(jobs), desc="verify", unit="sample", file=sys.stderr)
    with Verifier(audit=audit) as verifier:
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
    from rl.rundir import atomic_write

    atomic_write(out, "\n".join(lines + [json.dumps(summary)]) + "\n")
    print(json.dumps(summary))
    print(f"results -> {out}; audit log -> {audit}", file=sys.stderr)
    return 0
