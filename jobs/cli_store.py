"""`sarl store inspect`: the exchange store of a run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    q = sub.add_parser("store", help="the exchange store of a run")
    ssub = q.add_subparsers(dest="store_cmd", required=True, metavar="ACTION")
    s = ssub.add_parser(
        "inspect", help="weight versions, batches, consumed and unconsumed counts, sizes; exit 1 if anything is damaged"
    )
    s.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(handler=inspect)


def inspect(args: argparse.Namespace) -> int:
    from jobs.output import emit_json
    from rl.errors import ConfigError
    from rl.layout import RunLayout
    from rl.learner.checkpoints import LearnerCheckpoints
    from rl.store.inspect import inspect as inspect_store
    from rl.store.inspect import render
    from rl.store.zgroup import Damage

    store = RunLayout(args.run_dir).store_path
    if not store.is_dir():
        raise ConfigError(f"{args.run_dir}: no store.zarr (not a run directory?)")
    checkpoints = LearnerCheckpoints(args.run_dir)
    ckpt = checkpoints.latest()
    skipped = [Damage(path, why) for path, why in checkpoints.skipped]
    info = inspect_store(store, ckpt.cursor if ckpt else None, ckpt.path.name if ckpt else None, skipped)
    if args.json:
        emit_json(info, indent=1)
    else:
        print(render(info))
    return 1 if info["damaged"] else 0
