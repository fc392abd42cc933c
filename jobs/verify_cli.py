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
    if args.tasks_cmd == "report":
        return _report(args.run_dir)
    raise AssertionError(args.tasks_cmd)


def _report(run_dir: Path) -> int:
    """Merge the validation role's shards into a report and a clean task file."""
    from rl.rundir import RunDir, atomic_write, read_json
    from rl.taskpool import duplicates
    from rl.tasks import read_tasks, write_tasks

    rd = RunDir(run_dir)
    cfg = rd.config()
    if cfg.validation is None:
        print(f"sarl tasks report: {run_dir} has no validation role", file=sys.stderr)
        return 2
    tasks = list(read_tasks(cfg.validation.tasks_file))
    reports: dict[str, dict] = {}
    for shard in range(cfg.validation.tasks):
        state = read_json(rd.state_path("validation", shard)) or {}
        for r in state.get("reports", []):
            reports[r["task_id"]] = r
    for tid, why in duplicates(tasks).items():
        if tid in reports:
            reports[tid]["problems"].append(why)
            reports[tid]["ok"] = False
    missing = [t.task_id for t in tasks if t.task_id not in reports]
    ordered = [reports[t.task_id] for t in tasks if t.task_id in reports]
    report = {
        "tasks": len(tasks),
        "validated": len(ordered),
        "not_yet_validated": len(missing),
        "ok": sum(r["ok"] for r in ordered),
        "flagged": sum(not r["ok"] for r in ordered),
        "reports": ordered,
    }
    atomic_write(rd.path / "tasks.report.json", json.dumps(report, indent=1) + "\n")
    ok = {r["task_id"] for r in ordered if r["ok"]}
    write_tasks(rd.path / "tasks.clean.jsonl", [t for t in tasks if t.task_id in ok])
    print(json.dumps({k: v for k, v in report.items() if k != "reports"}))
    return 0 if not missing else 1


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
    vcfg, scfg = None, None
    if args.config is not None:  # [verify] weights and gates, [sandbox] backend and limits
        from rl.config import ConfigError, load_config

        try:
            run_cfg = load_config(args.config, cluster="local")
        except ConfigError as e:
            print(f"sarl verify: config error:\n{e}", file=sys.stderr)
            return 2
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
    from rl.rundir import atomic_write

    atomic_write(out, "\n".join(lines + [json.dumps(summary)]) + "\n")
    print(json.dumps(summary))
    print(f"results -> {out}; audit log -> {audit}", file=sys.stderr)
    return 0
