"""`sarl generate RUN_DIR MESSAGE`: one chat turn through the run's live
generators, to check that they serve and which weight version answers; it
asks as any OpenAI client does, through the endpoint (rl.gateway).
`sarl generate RUN_DIR --task TASKS.jsonl:TASK_ID`: one whole episode of a
task, played by the same agent and environment as rollouts and `sarl eval`
(rl.episodes.episode), printed turn by turn with its verdict."""

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
    from rl.model import checkpoint, load_tokenizer
    from rl.serving.client import GeneratorClient

    if (args.message is None) == (args.task is None):
        print("sarl generate: give a MESSAGE or --task TASKS.jsonl:TASK_ID (one of them)", file=sys.stderr)
        return 2
    rd = run_dir(args.run_dir)
    cfg = rd.config()
    tok = load_tokenizer(checkpoint(cfg.model))
    client = GeneratorClient(rd.path, timeout_s=args.timeout, wait_for_generator_s=args.wait)
    if args.task is not None:
        return _episode(args, rd, cfg, tok, client)
    max_len = cfg.generator.engine.max_model_len if cfg.generator is not None else 2048
    try:
        said = _through_the_endpoint(client, tok, max_len, cfg.run.name, args)
    except BadRequest as e:
        print(f"sarl generate: refused: {e}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(said)
    else:
        print(said["text"])
        print(
            f"(weight version {said['version']}, {len(said['token_ids'])} tokens, {said['finish_reason']})",
            file=sys.stderr,
        )
    return 0


def _through_the_endpoint(client: Any, tok: Any, max_len: int, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One chat turn as any OpenAI client asks it: through the endpoint
    (rl.gateway), here in this process in front of the run's generators,
    with the official `openai` client; the ids and log-probs it sampled are
    its session's record."""
    import secrets

    import openai

    from rl.engine import BadRequest
    from rl.errors import SarlError
    from rl.gateway.backends import ClientBackend
    from rl.gateway.capture import Sessions
    from rl.gateway.server import Gateway

    sessions = Sessions()
    backend = ClientBackend(client, max_len, len(tok))
    with Gateway(backend, tok, model=name, token=secrets.token_urlsafe(16), sessions=sessions).start() as gw:
        session = sessions.open("generate")
        api = openai.OpenAI(base_url=gw.url, api_key=session.key, max_retries=0, timeout=args.timeout + args.wait + 30)
        try:
            r = api.chat.completions.create(
                model=name,
                messages=[{"role": "user", "content": args.message}],
                max_tokens=128 if args.max_tokens is None else args.max_tokens,
                temperature=0.0 if args.temperature is None else args.temperature,
            )
        except openai.APIStatusError as e:
            message = (e.body or {}).get("message", str(e)) if isinstance(e.body, dict) else str(e)
            if e.status_code == 400:
                raise BadRequest(message) from None
            raise SarlError(message) from None
    call = session.calls[0]
    return {
        "version": call.version,
        "text": r.choices[0].message.content or "",
        "token_ids": call.sampled_ids,
        "logprobs": call.logprobs,
        "finish_reason": call.finish_reason,
    }


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
