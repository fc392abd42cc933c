"""`sarl chaos RUN.toml`: harm a real run on the local Slurm and check that
nothing was lost or done twice (rl.chaos.run). The measurement returns
data; this module prints it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    q = sub.add_parser(
        "chaos",
        help="run a config on the local Slurm while killing, cancelling, preempting and stopping its tasks; "
        "check every rollout was consumed once",
    )
    q.add_argument("config", type=Path, help="the run's config (generator, rollout and learner sections)")
    q.add_argument("--injections", type=int, default=20, help="faults to inject (default 20)")
    q.add_argument("--seed", type=int, default=0, help="seeds the faults' kinds, targets and times")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.add_argument("--dir", type=Path, default=None, help="a new folder for the runs (default: a temporary one)")
    q.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the run without faults (no throughput ratio)")  # fmt: skip
    q.add_argument("--gap", type=float, nargs=2, default=(2.0, 8.0), metavar=("MIN", "MAX"),
                   help="seconds between a fault healed and the next, drawn uniformly (default 2 8)")  # fmt: skip
    q.add_argument("--heal-timeout", type=float, default=300, help="seconds a fault may take to heal")
    q.add_argument("--timeout", type=float, default=3600, help="seconds each run may take")
    q.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from jobs.output import emit_json
    from rl.chaos.run import chaos

    result, lines = chaos(args)
    if args.json:
        emit_json(result)
    else:
        print("\n".join(lines))
    return 0 if result["ok"] else 1
