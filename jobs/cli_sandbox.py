"""`sarl sandbox run`: one command in a fresh sandbox, its result as JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
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
    s.set_defaults(handler=run, json=True)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from jobs.output import emit_json
    from rl.config import ConfigError, parse_overrides
    from sandboxes import run_once
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
    result = run_once(command, cfg, files=files or None)
    emit_json(result.to_json())
    return 0
