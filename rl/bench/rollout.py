"""`sarl bench rollout`: episodes per second of a real rollout worker against
a live vLLM generator, with `concurrency` 8 beside `concurrency` 1, and
concurrency 8 with the first replies of a group as one request with n
(`rollout.group_request`, the default) beside a request per episode, in one
run, on the same tasks and the same engine.

Everything is the product's own path: the generator service over HTTP with
the run's secret, the generator client, the agent, warm sandboxes, the
verifier in fresh sandboxes, and batches committed to a real store. Each
concurrency gets its own run directory (its own store), so neither sees the
other's pass rates.

* `episodes_per_s`: episodes committed / wall time of the worker's loop
  (from its first group started to its last batch committed);
* `generator_busy`: the share of that wall time the engine was generating
  (the service's own engine-time counter);
* `generate_share`, `execute_share`, `verify_share`: the episodes' time in
  each, over (wall time x concurrency): the share of an episode slot's time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rl.config import validate_config
from rl.layout import RunLayout

ENVS = {"function": (2, 2048), "workspace": (4, 4096)}
"""Turns per episode and model length of each environment measured."""


def _config(
    root: Path,
    name: str,
    tasks_file: Path,
    groups: int,
    concurrency: int,
    max_tokens: int,
    dtype: str,
    group_request: bool,
    env: str = "function",
) -> Any:
    turns, max_len = ENVS[env]
    raw = {
        "run": {"name": name, "root": str(root), "seed": 1},
        "executor": {"type": "local"},
        "model": {"dtype": dtype},
        "generator": {"engine": {"type": "vllm", "max_model_len": max_len}},
        "rollout": {
            "tasks_file": str(tasks_file),
            "groups": groups,
            "group_size": 4,
            "concurrency": concurrency,
            "batch_groups": 2,
            "group_request": group_request,
            "agent": {"max_turns": turns, "max_tokens": max_tokens, "temperature": 0.8},
        },
    }
    return validate_config(raw, "bench rollout", cluster="local", base_dir=root)


def _measure(engine: Any, cfg: Any, c: int) -> dict[str, Any]:
    """One worker at concurrency `c` against a generator service on `engine`."""
    from rl.rollout.loop import play
    from rl.rollout.worker import Worker
    from rl.run.role import context_of
    from rl.serving.inprocess import serving

    run_dir = cfg.run_dir
    RunLayout(run_dir).endpoints_path.mkdir(parents=True)
    worker = Worker(context_of(cfg, run_dir), cfg.rollout)
    with serving(engine, run_dir) as server:
        busy0 = server.health()["generate_s"]
        play(worker)
        busy = server.health()["generate_s"] - busy0
    wall = worker.loop_s
    busy = server.health()["generate_s"] - busy0
    reader = worker.store.reader()
    batches = [reader.read(k) for k in reader.committed()]
    episodes = sum(len(b) for b in batches)
    out: dict[str, Any] = {
        "episodes": episodes,
        "wall_s": round(wall, 2),
        "episodes_per_s": round(episodes / wall, 4),
        "generator_busy": round(min(1.0, busy / wall), 3),
        "tokens_sampled": int(sum(int((b.columns["versions"] >= 0).sum()) for b in batches)),
    }
    for j, t in enumerate(("generate", "execute", "verify")):
        out[f"{t}_share"] = round(sum(float(b.timings[:, j].sum()) for b in batches) / (wall * c), 3)
    return out


def _tool_costs(calls: int = 20) -> dict[str, float]:
    """Median milliseconds of each workspace tool, called `calls` times in one
    warm sandbox through the environment's own code (rl.agent.workspace)."""
    import statistics

    from rl.agent.config import AgentConfig
    from rl.agent.env import EnvContext
    from rl.agent.tools import Call
    from rl.agent.workspace import WorkspaceEnv
    from rl.model import ModelConfig, checkpoint, load_tokenizer
    from rl.tasks.workspaces import workspace_tasks
    from sandboxes import open_sandbox

    task = workspace_tasks()[0]
    tok = load_tokenizer(checkpoint(ModelConfig(dtype="float32")))
    path = next(p for p in task.files if p.endswith(".py") and not p.startswith("tests/") and "__init__" not in p)
    test = next(p for p in task.files if p.startswith("tests/"))
    kinds = {
        "shell_tests": Call("shell", {"command": f"python3 {test}"}),
        "shell_ls": Call("shell", {"command": "ls -la"}),
        "read_file": Call("read_file", {"path": path}),
        "write_file": Call("write_file", {"path": path, "content": task.files[path]}),
    }
    out = {}
    with open_sandbox() as sb:
        env = WorkspaceEnv(EnvContext(task, sb, None, AgentConfig(), tokenizer=tok))
        env.reset(task)
        for name, c in kinds.items():
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                env.call(c, 256)
                times.append(time.perf_counter() - t0)
            out[f"tool_ms_{name}"] = round(1000 * statistics.median(times), 1)
    return out


def bench_rollout(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    from tqdm import tqdm

    from rl.engine import make_engine
    from rl.tasks.format import write_tasks
    from rl.tasks.importers import import_humaneval
    from rl.tasks.workspaces import workspace_tasks

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the figures
    groups = {1: 2, 8: 6} if args.quick else {1: 4, 8: 16}
    if args.groups:
        groups = {1: args.groups[0], 8: args.groups[1]}
    max_tokens = args.max_tokens or (96 if args.quick else 160)
    bar = tqdm(total=4, desc="bench rollout", file=sys.stderr)
    env = getattr(args, "env", "function")
    turns = ENVS[env][0]
    r: dict[str, Any] = {"dtype": args.dtype, "max_tokens": max_tokens, "group_size": 4, "max_turns": turns, "env": env}
    with tempfile.TemporaryDirectory(prefix="sarl-bench-rollout-") as tmp:
        root = Path(tmp)
        tasks_file = root / "tasks.jsonl"
        write_tasks(tasks_file, workspace_tasks() if env == "workspace" else import_humaneval()[:40])
        cfg0 = _config(root, "c1", tasks_file, groups[1], 1, max_tokens, args.dtype, True, env)
        assert cfg0.generator is not None
        t0 = time.perf_counter()
        engine = make_engine(cfg0.generator.engine, cfg0.model)
        r["engine_start_s"] = round(time.perf_counter() - t0, 1)
        bar.update()
        # concurrency 1, then 8 with a request per episode (the baseline of the group request), then 8
        for c, key, group_request in ((1, "_c1", True), (8, "_alone", False), (8, "", True)):
            cfg = _config(root, f"c{c}{key}", tasks_file, groups[c], c, max_tokens, args.dtype, group_request, env)
            r.update({k + key: v for k, v in _measure(engine, cfg, c).items()})
            bar.update()
        engine.close()
    if env == "workspace":
        r.update(_tool_costs())
    bar.close()
    r["speedup"] = round(r["episodes_per_s"] / r["episodes_per_s_c1"], 2)
    r["group_request_speedup"] = round(r["episodes_per_s"] / r["episodes_per_s_alone"], 2)
    return r, _rollout_lines(r)


def _rollout_lines(r: dict[str, Any]) -> list[str]:
    env, turns, max_tokens = r["env"], r["max_turns"], r["max_tokens"]
    lines = [
        f"rollout: {'workspace tasks with tools' if env == 'workspace' else 'HumanEval'}, SmolLM2-135M-Instruct on "
        f"vLLM (CPU, {r['dtype']}), group size 4, up to {turns} turns of {max_tokens} tokens",
        f"  concurrency 8   {r['episodes_per_s']:.3f} episodes/s  ({r['episodes']} in {r['wall_s']} s), "
        f"generator busy {r['generator_busy']:.0%}",
        f"  concurrency 1   {r['episodes_per_s_c1']:.3f} episodes/s  ({r['episodes_c1']} in {r['wall_s_c1']} s), "
        f"generator busy {r['generator_busy_c1']:.0%}",
        f"  speedup {r['speedup']}x (target >= 3)",
        f"  concurrency 8, a request per episode (rollout.group_request = false): {r['episodes_per_s_alone']:.3f} "
        f"episodes/s ({r['episodes_alone']} in {r['wall_s_alone']} s); one request per group's first replies: "
        f"{r['group_request_speedup']}x",
        f"  time shares at concurrency 8: generate {r['generate_share']:.0%}, execute "
        f"{r['execute_share']:.0%}{' (the tools)' if env == 'workspace' else ''}, "
        f"verify {r['verify_share']:.0%} (target < 5%)",
        f"  time shares at concurrency 1: generate {r['generate_share_c1']:.0%}, execute "
        f"{r['execute_share_c1']:.0%}, verify {r['verify_share_c1']:.0%}",
        f"  engine start {r['engine_start_s']} s (not counted)",
    ]
    if env == "workspace":
        per_reply = r["wall_s_c1"] * r["generate_share_c1"] / max(1, r["episodes_c1"] * turns)
        lines.append(
            f"  one tool call (median of 20, warm sandbox): shell running the visible tests {r['tool_ms_shell_tests']} "
            f"ms, shell ls {r['tool_ms_shell_ls']} ms, read_file {r['tool_ms_read_file']} ms, write_file "
            f"{r['tool_ms_write_file']} ms; a reply takes up to {1000 * per_reply:.0f} ms to generate at concurrency 1"
        )
    return lines
