"""`sarl tasks split | leaks | sets | band | validate | report | quarantine |
quarantined | schema`: splits, task sets by role, validation, and a run's
quarantine. `import`, `generate` and `traces`: jobs.cli_task_files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    from jobs.cli_task_files import add_task_files

    q = sub.add_parser("tasks", help="task files: import, generate, traces, split, validate, report, schema")
    tsub = q.add_subparsers(dest="tasks_cmd", required=True, metavar="ACTION")
    add_task_files(tsub)
    _splits(tsub)
    _sets_by_role(tsub)
    _validation(tsub)


def _splits(tsub: Any) -> None:
    """Split and leaks: held-out sets, and what they share with training."""
    s = tsub.add_parser(
        "split", help="split a task file into train and held-out parts by whole templates (or families), leak-checked"
    )
    s.add_argument("file", type=Path, metavar="TASKS.jsonl")
    s.add_argument("--held-out", type=float, required=True, metavar="FRACTION")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--by", choices=("template", "family"), default="template", help="what is held out whole")
    s.add_argument("--train", type=Path, help="default: TASKS.train.jsonl")
    s.add_argument("--heldout", type=Path, help="default: TASKS.heldout.jsonl")
    s.set_defaults(handler=split)
    s = tsub.add_parser(
        "leaks",
        help="what held-out tasks share with training tasks: templates, reference programs, near-duplicate prompts; "
        "exit 1 when any leaks",
    )
    s.add_argument("files", type=Path, nargs="+", metavar="TRAIN.jsonl [...] HELDOUT.jsonl",
                   help="training files, then the held-out file")  # fmt: skip
    s.add_argument(
        "--level",
        choices=("templates", "instances", "both"),
        default="templates",
        help="templates: shared templates, reference programs, near-duplicate descriptions (a held-out set of "
        "templates no run trained on); instances: the same task (prompt, reference program, behaviour, "
        "near-duplicate whole prompt), whatever its template (fresh instances of trained templates)",
    )
    s.add_argument("--threshold", type=float, default=None, help="near-duplicate: estimated Jaccard at least this "
                   "(default 0.8 for templates, 0.9 for instances)")  # fmt: skip
    s.add_argument("--json", action="store_true")
    s.set_defaults(handler=leaks)


def _sets_by_role(tsub: Any) -> None:
    """Sets and band: the sets of `sarl bench learn`, by role."""
    s = tsub.add_parser(
        "sets",
        help="task sets by role from a generated file: A (warm start), U (whole templates no run trains on) "
        "and candidates for B (fresh instances of the other templates); then `sarl tasks band`",
    )
    s.add_argument("file", type=Path, metavar="TASKS.jsonl")
    s.add_argument("--held-out", type=float, required=True, metavar="FRACTION", help="of the tasks, by templates: U")
    s.add_argument(
        "--new",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="of the other templates, kept from A: B may then hold templates new to the warm start",
    )
    s.add_argument("--candidates", type=int, default=2, metavar="N", help="fresh instances of each template")
    s.add_argument("--fresh", type=int, default=4, metavar="N",
                   help="fresh instances a template must have left for B' (band's --fresh): a template short of "
                   "them is no candidate, so no eval measures it for nothing")  # fmt: skip
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("-o", "--prefix", type=Path, help="PREFIX.A.jsonl, ... (default: TASKS without .jsonl)")
    s.set_defaults(handler=sets)
    s = tsub.add_parser(
        "band",
        help="B and B': the candidates of the templates whose measured pass rate (sarl eval -n 8 on the "
        "candidates) is within a band, and fresh instances of them",
    )
    s.add_argument("candidates", type=Path, metavar="CANDIDATES.jsonl")
    s.add_argument(
        "--results",
        type=Path,
        nargs="+",
        required=True,
        metavar="EVAL_FOLDER",
        help="`sarl eval` result folders (their results.jsonl) of the warm start on the candidates",
    )
    s.add_argument("--band", type=float, nargs=2, default=(0.1, 0.8), metavar=("LOW", "HIGH"))
    s.add_argument("--by", choices=["pass", "reward"], default="pass",
                   help="the rate the band bounds: pass, the share of samples that passed; reward, the mean "
                   "reward (partial credit: text tasks)")  # fmt: skip
    s.add_argument("--fresh", type=int, default=4, metavar="N", help="fresh instances of each kept template: B'")
    s.add_argument("--avoid", type=Path, nargs="*", default=[], metavar="FILE",
                   help="task files no B' task may be an instance of (A, U, ...)")  # fmt: skip
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "-o", "--prefix", type=Path, help="PREFIX.B.jsonl, PREFIX.B-fresh.jsonl (default: beside CANDIDATES)"
    )
    s.set_defaults(handler=band)


def _validation(tsub: Any) -> None:
    """Validate, report, quarantine, quarantined, schema."""
    s = tsub.add_parser("validate", help="check every task; write a report and a clean task file")
    s.add_argument("file", type=Path, metavar="TASKS.jsonl")
    s.add_argument("-o", "--output", type=Path, help="clean task file (default: TASKS.clean.jsonl)")
    s.add_argument("--report", type=Path, help="report (default: TASKS.report.json)")
    s.add_argument("--repeats", type=int, default=3, help="runs of each reference (flaky tests disagree)")
    s.add_argument(
        "--against", type=Path, metavar="TRAIN.jsonl", help="a held-out file: a task that leaks from TRAIN is not clean"
    )
    s.set_defaults(handler=validate)
    s = tsub.add_parser(
        "report",
        help="merge a validation run's shards: RUN_DIR/tasks.report.json, tasks.clean.jsonl; print a JSON summary",
    )
    s.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    s.set_defaults(handler=report, json=True)
    s = tsub.add_parser("quarantine", help="keep a task of a run out of every rollout worker's draws")
    s.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    s.add_argument("task_id", metavar="TASK_ID")
    s.add_argument("--reason", required=True, help="why (shown by `sarl tasks quarantined`)")
    s.set_defaults(handler=quarantine)
    s = tsub.add_parser("quarantined", help="list a run's quarantined tasks with their reasons (JSON)")
    s.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    s.set_defaults(handler=quarantined, json=True)
    s = tsub.add_parser("schema", help="print the JSON schema of one line of a task file")
    s.set_defaults(handler=schema, json=True)


def split(args: argparse.Namespace) -> int:
    from rl.tasks.format import read_tasks, write_tasks
    from rl.tasks.split import split_tasks

    s = split_tasks(list(read_tasks(args.file)), args.held_out, args.seed, by=args.by)
    stem = args.file.name.removesuffix(".gz").removesuffix(".jsonl")
    train_path = args.train or args.file.with_name(stem + ".train.jsonl")
    held_path = args.heldout or args.file.with_name(stem + ".heldout.jsonl")
    write_tasks(train_path, s.train)
    write_tasks(held_path, s.held)
    units = "families" if args.by == "family" else "templates"
    print(
        f"{len(s.train)} tasks -> {train_path}; {len(s.held)} held out -> {held_path}: "
        f"{s.held_units} of {s.units} {units} held out whole; {s.moved} held-out tasks that still leaked "
        f"(same reference or near-duplicate prompt) moved to training; leak check: {len(s.leaks.leaking)} leak",
        file=sys.stderr,
    )
    return 0


def leaks(args: argparse.Namespace) -> int:
    from rl.tasks.format import read_tasks
    from rl.tasks.instances import NEAR, instance_leaks
    from rl.tasks.leakage import find_leaks

    if len(args.files) < 2:
        print("sarl tasks leaks: give one or more training files and the held-out file", file=sys.stderr)
        return 2
    if args.threshold is not None and not 0.0 < args.threshold <= 1.0:
        print(f"sarl tasks leaks: --threshold {args.threshold}: a Jaccard in (0, 1]", file=sys.stderr)
        return 2
    train = [t for f in args.files[:-1] for t in read_tasks(f)]
    held = list(read_tasks(args.files[-1]))
    levels = ("templates", "instances") if args.level == "both" else (args.level,)
    reports = {
        level: find_leaks(train, held, args.threshold or 0.8)
        if level == "templates"
        else instance_leaks(train, held, args.threshold or NEAR)
        for level in levels
    }
    if args.json:
        from jobs.output import emit_json

        emit_json({level: r.to_json() for level, r in reports.items()}, indent=1)
    else:
        print("\n".join(f"{level}: {r.summary()}" for level, r in reports.items()))
    return 1 if any(r.leaks for r in reports.values()) else 0


def sets(args: argparse.Namespace) -> int:
    from rl.tasks.format import read_tasks, write_tasks
    from rl.tasks.roles import make_sets

    got = make_sets(list(read_tasks(args.file)), args.held_out, args.new, args.candidates, args.seed, args.fresh)
    prefix = args.prefix or args.file.with_name(args.file.name.removesuffix(".gz").removesuffix(".jsonl"))
    paths = {name: prefix.with_name(f"{prefix.name}.{name}.jsonl") for name in ("A", "U", "candidates")}
    for name, tasks in (("A", got.a), ("U", got.u), ("candidates", got.candidates)):
        write_tasks(paths[name], tasks)
    c = got.templates
    print(
        f"A: {len(got.a)} tasks -> {paths['A']}; U: {len(got.u)} tasks of {c['u']} templates -> {paths['U']}; "
        f"candidates: {len(got.candidates)} fresh instances of {c['seen']} templates of A and {c['new']} kept "
        f"from it -> {paths['candidates']} ({c['short']} templates have fewer than {args.candidates + args.fresh} "
        f"fresh instances: {args.candidates} candidates and {args.fresh} for B')",
        file=sys.stderr,
    )
    return 0


def band(args: argparse.Namespace) -> int:
    from rl.tasks.format import read_tasks, write_tasks
    from rl.tasks.roles import band as choose
    from rl.tasks.roles import check_band, read_rates

    low, high = args.band
    check_band(low, high, args.fresh)
    rates: dict[str, float] = {}
    for results in args.results:
        rates.update(read_rates(results, args.by))
    avoid = [t for f in args.avoid for t in read_tasks(f)]
    got = choose(list(read_tasks(args.candidates)), rates, low, high, args.fresh, args.seed, avoid)
    stem = args.candidates.name.removesuffix(".jsonl").removesuffix(".candidates")
    prefix = args.prefix or args.candidates.with_name(stem)
    b_path, fresh_path = (prefix.with_name(f"{prefix.name}.{n}.jsonl") for n in ("B", "B-fresh"))
    write_tasks(b_path, got.b)
    write_tasks(fresh_path, got.b_fresh)
    print(
        f"B: {len(got.b)} tasks of {len(got.kept)} templates with a {args.by} rate in [{low}, {high}] "
        f"({got.kinds.get('seen', 0)} seen by the warm start, {got.kinds.get('new', 0)} new to it) -> {b_path}; "
        f"B': {len(got.b_fresh)} fresh instances -> {fresh_path}; {len(got.rates)} templates measured",
        file=sys.stderr,
    )
    return 0


def validate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rl.fsio import atomic_write
    from rl.tasks.format import read_tasks, write_tasks
    from rl.validation.report import report_json
    from rl.validation.report import validate as validate_tasks
    from rl.verify.verifier import Verifier

    tasks = list(read_tasks(args.file))
    clean = args.output or args.file.with_name(args.file.name.removesuffix(".jsonl") + ".clean.jsonl")
    report_path = args.report or args.file.with_name(args.file.name.removesuffix(".jsonl") + ".report.json")
    bar = tqdm(total=len(tasks), desc="validate", unit="task", file=sys.stderr)
    with Verifier() as verifier:
        reports = validate_tasks(tasks, verifier, repeats=args.repeats, progress=bar.update)
    bar.close()
    if args.against is not None:  # a held-out file: leaking tasks are not clean
        from rl.tasks.leakage import find_leaks

        found = find_leaks(list(read_tasks(args.against)), tasks)
        for r in reports:
            mine = [x for x in found.leaks if x.held == r.task_id]
            r.problems += [f"leaks: {x.kind} of {x.train} in {args.against}" for x in mine]
            r.ok = not r.problems
        print(found.summary(), file=sys.stderr)
    atomic_write(report_path, json.dumps(report_json(reports), indent=1) + "\n")
    ok = {r.task_id for r in reports if r.ok}
    write_tasks(clean, [t for t in tasks if t.task_id in ok])
    for r in reports:
        if not r.ok:
            print(f"{r.task_id}: " + "; ".join(r.problems))
    print(f"{len(ok)} of {len(tasks)} tasks are clean -> {clean}; report -> {report_path}", file=sys.stderr)
    return 0


def report(args: argparse.Namespace) -> int:
    """Merge the validation role's shards into a report and a clean task file."""
    from jobs.cli_run import run_dir
    from jobs.output import emit_json
    from rl.errors import ConfigError
    from rl.fsio import atomic_write, read_json
    from rl.tasks.dedup import duplicates
    from rl.tasks.format import read_tasks, write_tasks

    rd = run_dir(args.run_dir)
    cfg = rd.config()
    if cfg.validation is None:
        raise ConfigError(f"{args.run_dir}: the run has no validation role")
    tasks = list(read_tasks(cfg.validation.tasks_file))
    reports: dict[str, dict] = {}
    for shard in range(cfg.validation.workers):
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
    emit_json({k: v for k, v in report.items() if k != "reports"})
    return 0 if not missing else 1


def schema(args: argparse.Namespace) -> int:
    from jobs.output import emit_json
    from rl.tasks.format import Task

    emit_json(Task.model_json_schema(), indent=1)
    return 0


def _run_tasks(run_dir: Path) -> list[str]:
    """The task ids a run's rollout workers draw from; a clear error otherwise."""
    from rl.errors import SarlError
    from rl.run.rundir import RunDir
    from rl.tasks.format import read_tasks

    rd = RunDir(run_dir)
    if not rd.exists():
        raise SarlError(f"{run_dir}: not a run directory (no run.toml)")
    cfg = rd.config()
    if cfg.rollout is None:
        raise SarlError(f"{run_dir}: the run has no [rollout] section: no task is drawn")
    return [t.task_id for f in cfg.rollout.tasks_file for t in read_tasks(f)]


def quarantine(args: argparse.Namespace) -> int:
    from rl.errors import SarlError
    from rl.tasks.quarantine import quarantine as add

    ids = _run_tasks(args.run_dir)
    if args.task_id not in ids:
        raise SarlError(f"task_id: {args.task_id!r} is not in the run's rollout.tasks_file")
    if add(args.run_dir, args.task_id, args.reason, by="sarl tasks quarantine"):
        print(f"quarantined {args.task_id}: workers stop drawing it within seconds", file=sys.stderr)
    else:
        print(f"{args.task_id} was already quarantined; its first reason stands", file=sys.stderr)
    return 0


def quarantined(args: argparse.Namespace) -> int:
    from jobs.output import emit_json
    from rl.tasks.quarantine import quarantined as listed

    emit_json(listed(args.run_dir, _run_tasks(args.run_dir)))
    return 0
