"""`sarl generate RUN_DIR MESSAGE`: one chat turn through the run's live
generators, to check that they serve and which weight version answers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    q = sub.add_parser("generate", help="one chat turn through the run's live generators")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("message")
    q.add_argument("--max-tokens", type=int, default=128)
    q.add_argument("--temperature", type=float, default=0.0)
    q.add_argument("--wait", type=float, default=10.0, help="seconds to wait for a generator to announce itself")
    q.add_argument("--timeout", type=float, default=120.0, help="seconds one generator may take to answer")
    q.add_argument("--json", action="store_true", help="print one JSON object: text, token ids, log-probs, version")
    q.set_defaults(handler=generate)


def generate(args: argparse.Namespace) -> int:
    from jobs.cli_run import run_dir
    from jobs.output import emit_json
    from rl.engine import BadRequest
    from rl.generator.client import GeneratorClient
    from rl.model import chat_ids, checkpoint, load_tokenizer

    rd = run_dir(args.run_dir)
    cfg = rd.config()
    tok = load_tokenizer(checkpoint(cfg.model))
    ids = chat_ids(tok, [{"role": "user", "content": args.message}])
    client = GeneratorClient(rd.path, timeout_s=args.timeout, wait_for_generator_s=args.wait)
    try:
        r = client.generate([ids], {"temperature": args.temperature, "max_tokens": args.max_tokens})
    except BadRequest as e:
        print(f"sarl generate: refused: {e}", file=sys.stderr)
        return 2
    c = r.outputs[0][0]
    text = tok.decode(c.token_ids, skip_special_tokens=True)
    if args.json:
        emit_json(
            {
                "version": r.version,
                "generator": r.endpoint.task,
                "text": text,
                "token_ids": c.token_ids,
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
            }
        )
    else:
        print(text)
        print(
            f"(weight version {r.version}, generator task {r.endpoint.task} at {r.endpoint.key}, "
            f"{len(c.token_ids)} tokens, {c.finish_reason})",
            file=sys.stderr,
        )
    return 0
