"""`sarl serve RUN_DIR [--version N]` or `sarl serve EXPORTED_DIR`: the
OpenAI-compatible endpoint on an engine of its own (rl.run.serve)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    q = sub.add_parser("serve", help="serve a run's weights (or an exported checkpoint) under the OpenAI API")
    q.add_argument("path", type=Path, metavar="RUN_DIR|EXPORTED_DIR")
    q.add_argument("--version", type=int, help="a run's weight version (default: the newest published)")
    q.add_argument("--engine", choices=("hf", "vllm"), help="(default: the run's generator engine, else vllm)")
    q.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    q.add_argument("--port", type=int, default=8000, help="TCP port (0: any free one; default 8000)")
    q.add_argument("--name", help="the model's name in requests (default: the run's or the folder's name)")
    q.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    from rl.run.serve import api_key, serving

    if not 0 <= args.port <= 65535:
        print(f"sarl serve: --port {args.port}: a port is 0 to 65535", file=sys.stderr)
        return 2
    key, generated = api_key()
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with serving(args.path, args.version, args.engine, args.host, args.port, key, args.name) as s:
        print(f"serving {s.model} (weight version {s.version}) at {s.gateway.url}", flush=True)
        if generated:
            print(f"key (SARL_API_KEY was not set): {key}", flush=True)
        print("OPENAI_BASE_URL and OPENAI_API_KEY set to these reach it; Ctrl-C stops it", file=sys.stderr, flush=True)
        done.wait()
    return 0
