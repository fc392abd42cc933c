"""`sarl config show | schema | reference`: the run configuration."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    from jobs.cli import add_overrides

    q = sub.add_parser("config", help="show a resolved config, or the schema of every config key")
    csub = q.add_subparsers(dest="config_cmd", required=True, metavar="ACTION")
    s = csub.add_parser("show", help="print the resolved config as TOML (defaults filled in)")
    s.add_argument("config", type=Path, metavar="RUN.toml")
    s.add_argument("--doc", action="store_true", help="list every key with its documentation")
    add_overrides(s)
    s.set_defaults(handler=show)
    s = csub.add_parser("schema", help="print the JSON schema of run.toml")
    s.set_defaults(handler=schema, json=True)
    s = csub.add_parser("reference", help="print every config key with its documentation, as Markdown")
    s.add_argument("-o", "--output", type=Path, help="write it to this file (docs/configuration.md)")
    s.set_defaults(handler=reference)


def show(args: argparse.Namespace) -> int:
    from rl.config import dump_toml, load_config
    from rl.configdoc import describe_fields

    cfg = load_config(args.config, args.overrides, args.cluster)
    if args.doc:
        for key, doc, safe in describe_fields():
            print(f"{key}{'  [safe mid-run]' if safe else ''}\n    {doc}")
    else:
        print(dump_toml(cfg), end="")
    return 0


def schema(args: argparse.Namespace) -> int:
    from jobs.output import emit_json
    from rl.config import Config

    emit_json(Config.model_json_schema(), indent=1)
    return 0


def reference(args: argparse.Namespace) -> int:
    from rl.configdoc import reference as page
    from rl.fsio import atomic_write

    text = page()
    if args.output is None:
        print(text, end="")
    else:
        atomic_write(args.output, text)
    return 0
