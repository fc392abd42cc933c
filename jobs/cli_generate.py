"""`sarl generate RUN_DIR MESSAGE`: one chat turn through the run's live
generators, to check that they serve and which weight version answers.
`sarl generate RUN_DIR --task TASKS.jsonl:TASK_ID`: one whole episode of a
task, played by the same agent and environment as rollouts and `sarl eval`
(rl.rollout.episode), printed turn by turn with its verdict."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    q = sub.add_parser("generate", help="one chat turn through the run's live generators")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("message", nargs="?", help="a user message (or --task)")
    q.add_argument(
        "--task",
        metavar="TASKS.jsonl:TASK_ID",
        help="play one whole episode of this task with the run's agent and its environment, and print it",
    )
    q.add_argument("--max-tokens", type=int, help="tokens per reply (default: 128; with --task, the run's agent)")
    q.add_argument("--temperature", type=float, help="(default: 0, greedy; with --task, the run's agent)")
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

    if (args.message is None) == (args.task is None):
        print("sarl generate: give a MESSAGE or --task TASKS.jsonl:TASK_ID (one of them)", file=sys.stderr)
        return 2
    rd = run_dir(args.run_dir)
    cfg = rd.config()
    tok = load_tokenizer(checkpoint(cfg.model))
    client = GeneratorClient(rd.path, timeout_s=args.timeout, wait_for_generator_s=args.wait)
    if args.task is not None:
        return _episode(args, rd, cfg, tok, client)
    ids = chat_ids(tok, [{"role": "user", "content": args.message}])
    try:
        params = {
            "temperature": 0.0 if args.temperature is None else args.temperature,
            "max_tokens": 128 if args.max_tokens is None else args.max_tokens,
        }
        r = client.generate([ids], params)
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


def _episode(args: argparse.Namespace, rd: Any, cfg: Any, tok: Any, client: Any) -> int:
    from jobs.output import emit_json
    from rl.errors import SarlError
    from rl.eval.run import one_episode, with_changes
    from rl.run.role import context_of
    from rl.tasks.format import read_tasks

    path, sep, task_id = args.task.rpartition(":")
    if not sep or not path or not task_id:
        raise SarlError(f"--task {args.task!r}: give TASKS.jsonl:TASK_ID")
    task = next((t for t in read_tasks(path) if t.task_id == task_id), None)
    if task is None:
        raise SarlError(f"--task: {path} has no task {task_id!r}")
    changes = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    agent = with_changes(cfg.agent(), {k: v for k, v in changes.items() if v is not None})
    max_len = cfg.generator.engine.max_model_len if cfg.generator is not None else None
    ep, version = one_episode(context_of(cfg, rd.path), agent, task, client, max_len or 2048)
    v = ep.verdict
    if args.json:
        emit_json(
            {
                "task_id": task.task_id,
                "version": version,
                "turns": ep.turns,
                "end": ep.end,
                "reward": v.reward,
                "passed": v.passed,
                "failure": v.failure,
                "tool_calls": ep.tool_calls,
                "tool_failures": dict(ep.tool_failures),
                "token_ids": ep.trajectory.tokens,
                "loss_mask": ep.trajectory.loss_mask,
                "transcript": tok.decode(ep.trajectory.tokens),
            }
        )
        return 0
    print(tok.decode(ep.trajectory.tokens))
    failures = ", ".join(f"{k} {n}" for k, n in sorted(ep.tool_failures.items()))
    print(
        f"({task.task_id}: weight version {version}, {ep.turns} turns, ended: {ep.end}; reward {v.reward:.3f}, "
        f"{'passed' if v.passed else 'failed: ' + v.failure}"
        + (f"; {ep.tool_calls} tool calls{', ' + failures if failures else ''}" if ep.tool_calls else "")
        + ")",
        file=sys.stderr,
    )
    return 0
