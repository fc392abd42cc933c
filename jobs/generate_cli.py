"""`sarl generate RUN_DIR MESSAGE`: one chat turn through the run's live
generators, to check that they serve and which weight version answers."""

from __future__ import annotations

import argparse
import json
import sys


def generate_main(args: argparse.Namespace) -> int:
    from rl.engine import BadRequest
    from rl.genclient import GeneratorClient, NoGenerator
    from rl.model import chat_ids, checkpoint, load_tokenizer
    from rl.rundir import RunDir

    rd = RunDir(args.run_dir)
    cfg = rd.config()
    tok = load_tokenizer(checkpoint(cfg.model))
    ids = chat_ids(tok, [{"role": "user", "content": args.message}])
    client = GeneratorClient(rd.path, timeout_s=args.timeout, wait_for_generator_s=args.wait)
    try:
        r = client.generate([ids], {"temperature": args.temperature, "max_tokens": args.max_tokens})
    except NoGenerator as e:
        print(f"sarl generate: {e}", file=sys.stderr)
        return 1
    except BadRequest as e:
        print(f"sarl generate: refused: {e}", file=sys.stderr)
        return 2
    c = r.outputs[0][0]
    text = tok.decode(c.token_ids, skip_special_tokens=True)
    if args.json:
        print(
            json.dumps(
                {
                    "version": r.version,
                    "generator": r.endpoint.task,
                    "text": text,
                    "token_ids": c.token_ids,
                    "logprobs": c.logprobs,
                    "finish_reason": c.finish_reason,
                }
            )
        )
    else:
        print(text)
        print(
            f"(weight version {r.version}, generator task {r.endpoint.task} at {r.endpoint.key}, "
            f"{len(c.token_ids)} tokens, {c.finish_reason})",
            file=sys.stderr,
        )
    return 0
