"""`sarl submit | status | logs | cancel | resume | scale | report | export`: a run's jobs and results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    from jobs.cli import add_overrides

    q = sub.add_parser("submit", help="create (or resume) a run and submit its jobs; returns at once")
    q.add_argument("config", type=Path, metavar="RUN.toml")
    add_overrides(q)
    q.set_defaults(handler=submit)

    _watching(sub)

    q = sub.add_parser("cancel", help="cancel every job of a run (their state stays; resume continues)")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.set_defaults(handler=cancel)

    q = sub.add_parser("resume", help="resubmit the tasks of a run that are neither done nor running")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    add_overrides(q)
    q.set_defaults(handler=resume)

    q = sub.add_parser("scale", help="change a role's workers mid-run (rollout, generator) without losing work")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("target", metavar="ROLE=N", help="e.g. rollout=8")
    q.set_defaults(handler=scale)

    q = sub.add_parser(
        "report",
        help="write PNG plots and an HTML page of a run (reward, pass@1, failures, throughput, learning, "
        "policy, agent, control)",
    )
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("-o", "--output", type=Path, help="folder (default: RUN_DIR/report)")
    q.add_argument("--control", type=Path, metavar="RUN_DIR", help="a control run to draw beside this one "
                   "(the same config with learner.shuffle_rewards = true)")  # fmt: skip
    q.set_defaults(handler=report)

    q = sub.add_parser("export", help="write a weight version as a Hugging Face checkpoint folder")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("-o", "--output", type=Path, required=True, metavar="DIR", help="new folder to write")
    q.add_argument("--version", type=int, default=None, help="weight version (default: the newest)")
    q.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    q.set_defaults(handler=export)


def _watching(sub: Any) -> None:
    """`sarl status` and `sarl logs`: what a run's tasks are doing and wrote."""
    q = sub.add_parser("status", help="what each role's jobs are doing, and what failed and why")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.add_argument("--all", action="store_true", help="list every task, done ones included")
    q.add_argument(
        "--wait",
        action="store_true",
        help="follow the run until every task (but generators, which serve the others) is done or failed, "
        "then print the status; exit 1 if any failed. On a terminal a progress bar; through a pipe or into a "
        "file, plain lines (no carriage return)",
    )
    q.add_argument(
        "--every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with --wait, not on a terminal: a progress line at most this often (and on every change of the "
        "tasks' states; default 30)",
    )
    q.set_defaults(handler=status)

    q = sub.add_parser(
        "logs",
        help="a task's stdout and stderr from submitit's files, every attempt named (whatever job id or requeue "
        "it ran under)",
    )
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("which", nargs="?", metavar="ROLE[/TASK]", help="e.g. learner, rollout/3 (default: every task)")
    q.add_argument("-f", "--follow", action="store_true", help="then print what the newest attempts write, "
                   "until every task followed has ended")  # fmt: skip
    q.add_argument("-n", "--lines", type=int, default=50, metavar="N",
                   help="the last N lines of each part (default 50; 0: all)")  # fmt: skip
    q.add_argument("--stream", choices=("both", "stdout", "stderr"), default="both")
    q.add_argument("--rank", type=int, default=0, help="the process of a multi-process task (default 0)")
    q.set_defaults(handler=logs)


def export(args: argparse.Namespace) -> int:
    from jobs.output import emit_json
    from rl.run.export import export as export_version

    done = export_version(run_dir(args.run_dir).path, args.output, args.version)
    if args.json:
        emit_json(done)
    else:
        print(f"version {done['version']} of {done['run']} -> {done['folder']}")
    return 0


def scale(args: argparse.Namespace) -> int:
    from rl.run.scale import parse_target
    from rl.run.scale import scale as scale_role

    role, n = parse_target(args.target)
    subs = scale_role(run_dir(args.run_dir), role, n, say=lambda m: print(m, file=sys.stderr))
    _print_submitted(subs, run_dir(args.run_dir).path)
    return 0


def report(args: argparse.Namespace) -> int:
    from rl.run.report import write_report

    control = run_dir(args.control).path if args.control is not None else None
    folder = write_report(run_dir(args.run_dir).path, args.output, control)
    print((folder / "summary.txt").read_text(), end="")
    print(f"report: {folder / 'index.html'} (plots: {folder}/*.png)", file=sys.stderr)
    return 0


def run_dir(path: Path) -> Any:
    """The run directory at `path`; a ConfigError naming it when there is none."""
    from rl.errors import ConfigError
    from rl.run.rundir import RunDir

    rd = RunDir(path)
    if not rd.exists():
        raise ConfigError(f"{path}: not a run directory (no run.toml)")
    return rd


def submit(args: argparse.Namespace) -> int:
    from rl.config import load_config
    from rl.run.launch import submit as submit_run

    cfg = load_config(args.config, args.overrides, args.cluster)
    subs = submit_run(cfg, str(args.config), say=lambda m: print(m, file=sys.stderr))
    _print_submitted(subs, cfg.run_dir)
    return 0


def resume(args: argparse.Namespace) -> int:
    from rl.run.launch import resume as resume_run

    rd = run_dir(args.run_dir)
    new = rd.with_overrides(args.overrides, args.cluster) if args.overrides or args.cluster else None
    subs = resume_run(rd, new, f"{rd.config_path} (with --set)", say=lambda m: print(m, file=sys.stderr))
    _print_submitted(subs, rd.path)
    return 0


def logs(args: argparse.Namespace) -> int:
    from rl.errors import ConfigError
    from rl.run.logs import STREAMS, follow, show

    if args.lines < 0:
        raise ConfigError(f"-n must be 0 (all) or more, not {args.lines}")
    rd = run_dir(args.run_dir)
    streams = STREAMS if args.stream == "both" else (args.stream,)
    offsets: dict[Path, int] = {}
    shown = show(rd, args.which, sys.stdout, args.lines, streams, args.rank, offsets)
    if args.follow:
        try:
            follow(rd, args.which, sys.stdout, offsets, streams, args.rank)
        except KeyboardInterrupt:
            return 0
    elif not shown:
        print(f"no log yet for {args.which or 'any task'} in {rd.path / 'logs'}", file=sys.stderr)
    return 0


def cancel(args: argparse.Namespace) -> int:
    from rl.run.launch import cancel as cancel_run

    for line in cancel_run(run_dir(args.run_dir)):
        print(f"cancelled {line}")
    return 0


def _print_submitted(subs: list[Any], path: Path) -> None:
    for s in subs:
        n = len(s.tasks)
        print(f"Submitted {s.role} job {s.label} ({n} task{'s' if n != 1 else ''})")
    if subs:
        print(f"run directory: {path}", file=sys.stderr)


def status(args: argparse.Namespace) -> int:
    from jobs.output import emit_json
    from rl.errors import ConfigError
    from rl.run.status import render, run_status

    rd = run_dir(args.run_dir)
    if not args.wait:
        st = run_status(rd)
        if args.json:
            emit_json(st, indent=1)
        else:
            print(render(st, args.all))
        return 0
    from rl.run.watch import wait

    if args.every <= 0:
        raise ConfigError(f"--every must be a positive number of seconds, not {args.every:g}")
    failed = wait(rd, sys.stderr, every_s=args.every)
    st = run_status(rd)
    if args.json:
        emit_json(st, indent=1)
    else:
        print(render(st, args.all))
    return 1 if failed else 0
