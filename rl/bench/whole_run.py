"""`sarl bench rl`: end-to-end trained samples per second of a whole run, two
runs of one config measured in the same invocation: async mode beside sync
mode (`--vs modes`, the default), or the compute of the quickstart's RL run
before this round's work beside after it (`--vs compute`).

`--vs compute`: the quickstart's RL run as it was (sync mode, 4 groups of 4
per step, replies of up to 256 tokens, one turn, the roles sharing every
core, float32 everywhere, full fine-tuning in 2 micro-batches), then as it
is now: `auto` precision (bf16 where the CPU has it), LoRA r16 on every
linear layer, micro-batches cut by the token budget, each group's prompt
computed once by the learner (`learner.share_prefixes`; the "before" run
sets it off), and steps of 8 groups of 8 (64 replies: the engine decodes a
batch of 64 about 3x faster per token than one of 16). `compute_ratio` = after / before (target >= 3),
beside the mean sampled reply length of each (the same `max_tokens`).

`--vs modes`:
One config, run twice on the local executor (`run.mode = "sync"`, then
`"async"` with `max_staleness = 2`, `--max-staleness`): a generator, a rollout worker (the agent
in bubblewrap sandboxes, rewarded by hidden tests) and the learner, on
generated tasks. Each role is pinned to its own cores (`job.cpu_list`): the
generator and the rollout worker on the first half of this process's cores,
the learner on the second half. In sync mode the roles take turns, so each
half idles while the other works; async mode lets them overlap, which is
what the ratio measures.

Figures are taken in the steady state, from the run's TensorBoard events:
from the end of the learner's first step (every role has started, the
engine is warm) to the end of its last.

* `sync_samples_s`, `async_samples_s`: samples trained per second;
* `ratio` = async / sync (target >= 1.5);
* `{mode}_idle_generator`: the share of the window the generator waited on
  the other roles: its engine neither generated nor loaded a weight version
  (target in async < 20%);
* `{mode}_busy_generator`, `{mode}_swap_generator`: the shares it generated,
  and loaded weight versions (its own work, requests held meanwhile);
* `{mode}_idle_learner`: the share the learner waited for rollouts;
* `{mode}_idle_rollout`: the share the rollout worker had nothing to play
  (every group held back by the staleness or sync-round gate).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl.errors import SarlError
from rl.layout import RunLayout


@dataclass(frozen=True)
class Shape:
    """The size of each of the two runs."""

    steps: int
    groups_per_step: int
    group_size: int
    max_tokens: int
    """Tokens per reply."""
    train_top_layers: int | None
    """The learner trains the top blocks alone: a step then takes about as
    long as generating its samples, so that overlap can show."""

    @property
    def samples_per_step(self) -> int:
        return self.groups_per_step * self.group_size


FULL = Shape(steps=6, groups_per_step=2, group_size=4, max_tokens=96, train_top_layers=8)
QUICK = Shape(steps=3, groups_per_step=1, group_size=2, max_tokens=8, train_top_layers=None)
QUICKSTART = Shape(steps=5, groups_per_step=4, group_size=4, max_tokens=256, train_top_layers=None)
"""The quickstart's RL run until this round (examples/quickstart-rl.toml then)."""
QUICKSTART_NOW = Shape(steps=5, groups_per_step=8, group_size=8, max_tokens=256, train_top_layers=None)
"""Its shape now: a step's 64 replies fill the engine's batch."""

COMPUTE = {
    "before": {"dtype": "float32", "learner": 'precision = "float32"\nmicro_batches = 2\nshare_prefixes = false\n'},
    "after": {"dtype": "auto", "learner": 'precision = "auto"\n[learner.lora]\nrank = 16\nalpha = 32\n'},
}
"""`--vs compute`: the quickstart's compute until this round, and now."""


def _config(
    name: str,
    mode: str,
    model: str,
    tasks: Path,
    engine: str,
    p: Shape,
    gen: list[int] | None,
    lrn: list[int] | None,
    stale_max: int,
    compute: dict[str, str] | None = None,
) -> str:
    """The run's config. Episodes in flight: two steps' worth, so that in
    async mode the next step's replies are generated while this step's are
    verified (the staleness gate bounds how far ahead; a sync round is one
    step). Groups: twice what the steps need. A step takes whole batches
    until it has `samples_per_step`, and a batch may hold several groups, so
    an async step can take more than its share; the run is cancelled once
    the learner is done."""
    stale = f"max_staleness = {stale_max}\n" if mode == "async" else ""
    top = f"train_top_layers = {p.train_top_layers}\n" if p.train_top_layers else ""
    compute = compute or {"dtype": "float32", "learner": ""}
    pin = {"gen": f"cpu_list = {gen}\n" if gen else "", "lrn": f"cpu_list = {lrn}\n" if lrn else ""}
    return f"""
[run]
name = "{name}"
root = "runs"
mode = "{mode}"
{stale}seed = 1
[model]
path = {json.dumps(model)}
dtype = "{compute["dtype"]}"
[generator]
poll_s = 0.2
[generator.engine]
{engine}
[generator.job]
{pin["gen"]}mem_gb = 8
[rollout]
tasks_file = {json.dumps(str(tasks))}
groups = {2 * p.steps * p.groups_per_step}
groups_per_step = {p.groups_per_step}
group_size = {p.group_size}
concurrency = {2 * p.samples_per_step}
batch_groups = 1
[rollout.agent]
max_turns = 1
max_tokens = {p.max_tokens}
[rollout.job]
{pin["gen"]}[learner]
steps = {p.steps}
samples_per_step = {p.samples_per_step}
poll_s = 0.2
checkpoint_every = {p.steps}
keep_checkpoints = 1
{top}{compute["learner"]}[learner.optimizer]
lr = 1e-6
[learner.job]
{pin["lrn"]}mem_gb = 8
"""


def _last_before(points: list[tuple[float, int, float]], t: float) -> float:
    """The value of a cumulative curve at wall time `t` (0 before its first point)."""
    before = [v for w, _, v in points if w <= t + 1e-6]
    return before[-1] if before else 0.0


def _figures(run: Path) -> dict[str, float]:
    """Steady-state figures of a finished run, from its TensorBoard events."""
    from rl.run.report import read_curves

    curves = read_curves(RunLayout(run).curves_path)
    learner = curves.get("learner", {})
    steps = sorted(learner.get("learner/samples", []), key=lambda p: p[1])
    if len(steps) < 2:
        raise SarlError(f"bench rl: {run} has fewer than 2 learner steps in TensorBoard")
    t0, t1 = steps[0][0], steps[-1][0]
    window = max(t1 - t0, 1e-9)
    # by step, not wall time: step 1's figures are written a moment after t0
    waits = [v for _, step, v in learner.get("learner/wait_s", []) if step > steps[0][1]]
    lengths = [v for _, step, v in learner.get("learner/response_len", []) if step > steps[0][1]]
    out = {
        "samples_s": sum(v for _, _, v in steps[1:]) / window,
        "window_s": window,
        "idle_learner": min(1.0, sum(waits) / window),
        "response_len": sum(lengths) / max(1, len(lengths)),
    }

    def share(role: str, tag: str) -> float:
        """The mean share of the window a cumulative curve of seconds grew in, over the role's tasks."""
        series = [s[tag] for folder, s in curves.items() if folder.startswith(role) and tag in s]
        if not series:
            raise SarlError(f"bench rl: {run} has no {tag} curve")
        return sum(_last_before(pts, t1) - _last_before(pts, t0) for pts in series) / len(series) / window

    busy, swap = share("generator-", "generator/busy_s"), share("generator-", "generator/swap_s")
    out["busy_generator"], out["swap_generator"] = busy, swap
    out["idle_generator"] = max(0.0, 1.0 - busy - swap)
    out["idle_rollout"] = min(1.0, share("rollout-", "rollout/gate_wait_s"))
    return out


def _wait_done(run: Path, steps: int, what: str, bar: Any, timeout_s: float) -> None:
    """Until the learner of `run` is done."""
    deadline = time.time() + timeout_s
    state = RunLayout(run).state_path("learner", 0)
    shown = 0
    while time.time() < deadline:
        got = json.loads(state.read_text()) if state.exists() else {}
        step = min(int(got.get("step", 0)), steps)
        bar.update(max(0, step - shown))
        shown = max(shown, step)
        if got.get("done"):
            return
        time.sleep(1.0)
    raise SarlError(f"bench rl: the {what} run did not finish in {timeout_s:.0f} s ({run})")


def bench_rl(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    from tqdm import tqdm

    from rl.tasks.format import write_tasks
    from rl.tasks.synthesis import synthesize

    cores = sorted(os.sched_getaffinity(0))
    compute = args.vs == "compute"
    if not compute and len(cores) < 2:
        raise SarlError(f"bench rl: pins the roles to 2 groups of cores; this process may use {len(cores)} core")
    half = len(cores) // 2
    gen, lrn = (None, None) if compute else (cores[:half], cores[half:])
    p = QUICK if args.quick else (QUICKSTART if compute else FULL)
    shapes = {"after": QUICK if args.quick else QUICKSTART_NOW} if compute else {}
    model = str(Path(args.model).resolve()) if args.model else "smollm2-135m-instruct"
    engine = 'type = "hf"\nmax_model_len = 1024' if args.quick else 'type = "vllm"\nmax_model_len = 2048'
    work = Path(args.dir).resolve() if args.dir else Path(tempfile.mkdtemp(prefix="sarl-bench-rl-"))
    work.mkdir(parents=True, exist_ok=True)
    tasks = work / "tasks.jsonl"
    write_tasks(tasks, synthesize("all", 60, seed=1))
    sarl = str(Path(sys.executable).with_name("sarl"))
    r: dict[str, Any] = {"quick": bool(args.quick), "model": args.model or "smollm2-135m-instruct", **asdict(p)}
    r.update(vs=args.vs, generator_cores=gen, learner_cores=lrn, samples_per_step=p.samples_per_step)
    r["max_staleness"] = args.max_staleness
    runs = [("before", "sync", COMPUTE["before"]), ("after", args.after_mode, COMPUTE["after"])] if compute else [
        ("sync", "sync", None), ("async", "async", None)]  # fmt: skip
    bar = tqdm(total=2 * p.steps, desc=f"bench rl (learner steps, {runs[0][0]} then {runs[1][0]})", file=sys.stderr)
    try:
        for name, mode, how in runs:
            folder = work / name
            folder.mkdir(exist_ok=True)
            cfg = folder / "run.toml"
            shape = shapes.get(name, p)
            r[f"{name}_samples_per_step"] = shape.samples_per_step
            cfg.write_text(_config(name, mode, model, tasks, engine, shape, gen, lrn, args.max_staleness, how))
            out = subprocess.run([sarl, "submit", str(cfg), "--cluster", "local"], cwd=folder,
                                 capture_output=True, text=True)  # fmt: skip
            if out.returncode != 0:
                raise SarlError(f"bench rl: sarl submit of the {name} run failed:\n{out.stderr[-2000:]}")
            run = folder / "runs" / name
            try:
                _wait_done(run, p.steps, name, bar, timeout_s=args.timeout)
            finally:
                subprocess.run([sarl, "cancel", str(run)], cwd=folder, capture_output=True)
            for k, v in _figures(run).items():
                r[f"{name}_{k}"] = round(v, 4)
            r[f"{name}_samples_min"] = round(60 * r[f"{name}_samples_s"], 2)
            if compute:
                from rl.run.disk import disk_use

                r[f"{name}_disk_bytes"] = disk_use(run)["total"]
    finally:
        bar.close()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    a, b = runs[1][0], runs[0][0]
    r["compute_ratio" if compute else "ratio"] = round(r[f"{a}_samples_s"] / max(r[f"{b}_samples_s"], 1e-12), 3)
    return r, _lines(r)


def _lines(r: dict[str, Any]) -> list[str]:
    def row(name: str) -> str:
        return (
            f"  {name:<6} {r[f'{name}_samples_s']:8.3f} samples/s ({r[f'{name}_samples_min']:.1f}/min)"
            f"   idle: generator {r[f'{name}_idle_generator']:5.0%}"
            f"  learner {r[f'{name}_idle_learner']:5.0%}  rollout {r[f'{name}_idle_rollout']:5.0%}"
            f"   generator swapping weights {r[f'{name}_swap_generator']:4.0%}"
            f"   replies {r[f'{name}_response_len']:.0f} tokens   ({r[f'{name}_window_s']:.0f} s steady window)"
        )

    quick = " [--quick: not a measurement]" if r["quick"] else ""
    if r["vs"] == "compute":
        return [
            f"rl: trained samples/s of the quickstart's RL run as it was and as it is, {r['steps']} steps each, "
            f"up to {r['max_tokens']} tokens per reply, sync, the roles sharing the cores{quick}",
            row("before") + f"   [float32, full fine-tuning, 2 micro-batches, {r['before_samples_per_step']} a step]",
            row("after")
            + f"   [auto precision, LoRA r16, token budget, prompts shared, {r['after_samples_per_step']} a step]",
            f"  after / before {r['compute_ratio']} (target >= 3); run folders {r['before_disk_bytes'] / 1e9:.2f} GB "
            f"and {r['after_disk_bytes'] / 1e9:.2f} GB",
        ]
    return [
        f"rl: trained samples/s of a whole run, {r['steps']} steps of {r['samples_per_step']} samples, "
        f"{r['max_tokens']} tokens per reply, async max_staleness {r['max_staleness']}; generator and rollout on "
        f"cores {r['generator_cores']}, learner on {r['learner_cores']}" + quick,
        row("sync"),
        row("async"),
        f"  async / sync {r['ratio']} (target >= 1.5); generator idle in async "
        f"{r['async_idle_generator']:.0%} (target < 20%)",
    ]
