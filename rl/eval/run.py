"""Evaluate one weight version of a run on task files: `sarl eval`.

    the policy = live generators serving the version, or an engine started
                 here with the version loaded (version 0: the base model)
    for each plan (a task file and a sampling: greedy, or n at T), in turn,
    on that one policy:
      for each task, n episodes with the rollouts' agent (rl.episodes.episode:
        the same prompts, turns, sandboxes and verifier), seeds fixed by
        (task, sample)
      pass@k per task (rl.eval.passk), their means with standard errors
      -> RUN_DIR/eval/v<version>/<tasks>.<mode>/results.jsonl (one line per
         task), episodes.jsonl (one per episode, with its transcript) and
         summary.json, each written whole (<tasks>: the task file's
         name, another file of the same name gets a digest of its path;
         <mode>: `greedy` or `t1-n8`, then the turns: `gen.U.greedy.1turn`)

An engine started here serves through the product's own generator service
and client, announced in a folder of its own (never the run's endpoints,
where rollout workers would find it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl.agent.config import AgentConfig
from rl.context import RunContext
from rl.errors import SarlError
from rl.eval.passk import mean_and_se, pass_at_k
from rl.fsio import atomic_write
from rl.lifetime import gone, tag
from rl.tasks.format import Task


class EvalError(SarlError, RuntimeError):
    exit_code = 1


@dataclass
class TaskResult:
    task_id: str
    n: int
    passed: int
    pass_at: dict[str, float]
    failures: dict[str, int] = field(default_factory=dict)
    """Why samples failed, by reason (rl.episodes.samples vocabulary)."""
    turns_mean: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    reached_turn_2: int = 0
    """Samples that went on to a second turn (the first attempt's code failed
    the visible examples, and the agent was shown why)."""
    fixed_after_turn_1: int = 0
    """Of those, samples that passed in the end: repairs."""
    tool_calls: int = 0
    """Tool calls of all samples (environments with tools)."""
    tool_calls_invalid: int = 0
    """Of those, the invalid ones (rl.agent.tools.INVALID_CALLS)."""
    reward_mean: float = 0.0
    """The mean reward of its samples (partial credit: the tests score, or a
    text task's LCS ratio)."""
    tool_errors: int = 0
    """Of the valid ones, those the tool answered with an error (`tool-error`:
    an edit whose old text is not in the file, a SQL error)."""


def eval_seed(task_id: str, i: int) -> int:
    return int.from_bytes(hashlib.sha256(f"eval/{task_id}/{i}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def summarise(results: list[TaskResult], ks: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"tasks": len(results), "samples": sum(r.n for r in results)}
    for k in ks:
        m, se = mean_and_se([r.pass_at[f"pass@{k}"] for r in results if f"pass@{k}" in r.pass_at])
        out[f"pass@{k}"], out[f"se@{k}"] = round(m, 4), round(se, 4)
    m, se = mean_and_se([r.reward_mean for r in results])
    out["reward_mean"], out["reward_se"] = round(m, 4), round(se, 4)
    fails: Counter[str] = Counter()
    for r in results:
        fails.update(r.failures)
    out["failures"] = dict(sorted(fails.items()))
    from rl.episodes.samples import agent_shares

    reached, fixed = sum(r.reached_turn_2 for r in results), sum(r.fixed_after_turn_1 for r in results)
    out.update(agent_shares(out["samples"], fails.get("crash", 0), reached, fixed))
    calls = sum(r.tool_calls for r in results)
    if calls:
        from rl.agent.tools import tool_validity

        out["tool_calls_per_sample"] = round(calls / max(1, out["samples"]), 3)
        out["tool_valid_share"] = tool_validity(calls, sum(r.tool_calls_invalid for r in results))
        out["tool_error_share"] = round(sum(r.tool_errors for r in results) / calls, 4)
    return out


def task_result(
    task: Task,
    passed: list[bool],
    failures: list[str],
    turns: list[int],
    ks: list[int],
    tools: list[tuple[int, int, int]] | None = None,
    rewards: list[float] | None = None,
) -> TaskResult:
    """`tools`: (calls, invalid calls, calls answered with an error) of each
    sample; `rewards`: each sample's."""
    n, c = len(passed), sum(passed)
    tools = tools or []
    return TaskResult(
        task.task_id,
        n,
        c,
        {f"pass@{k}": round(pass_at_k(n, c, k), 6) for k in ks if k <= n},
        dict(Counter(f for f in failures if f)),
        round(sum(turns) / max(1, len(turns)), 3),
        {k: task.metadata[k] for k in ("family", "difficulty", "template", "to_warm_start") if k in task.metadata},
        sum(t >= 2 for t in turns),
        sum(t >= 2 and p for t, p in zip(turns, passed, strict=True)),
        sum(calls for calls, _, _ in tools),
        sum(bad for _, bad, _ in tools),
        round(sum(rewards) / len(rewards), 6) if rewards else 0.0,
        sum(errors for _, _, errors in tools),
    )


def play_mode(temperature: float, n: int, max_turns: int) -> str:
    """How the episodes were played, as a folder name's suffix: `greedy` or
    `t1-n8` (temperature, samples a task), then the turns (`1turn`,
    `3turns`). A greedy evaluation and a sampled one of the same tasks keep
    their per-task results apart."""
    sampling = "greedy" if temperature == 0 and n == 1 else f"t{temperature:g}-n{n}"
    return f"{sampling}.{max_turns}turn{'s' if max_turns > 1 else ''}"


def results_folder(version_dir: Path, tasks_file: str, mode: str) -> Path:
    """Where a version's results on `tasks_file` played in `mode` go
    (`gen.U.greedy.1turn`): a folder named by the file and the mode, unless
    another file of that name already holds it (two `held.jsonl` in
    different folders), then the name with a digest of the file's path. The
    same file played the same way again replaces the results."""
    folder = version_dir / f"{Path(tasks_file).name.removesuffix('.jsonl')}.{mode}"
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        if json.loads((folder / "summary.json").read_text())["tasks_file"] != tasks_file:
            return folder.with_name(folder.name + "-" + hashlib.sha256(tasks_file.encode()).hexdigest()[:8])
    return folder


@dataclass
class Plan:
    """What an evaluation plays: every task `n` times with `agent`."""

    tasks: list[Task]
    tasks_name: str
    """The task file, named in the results' folder."""
    agent: AgentConfig
    n: int = 1
    """Samples per task."""
    ks: list[int] = field(default_factory=lambda: [1])
    """The k of pass@k (each <= n)."""
    concurrency: int = 8
    """Episodes at once."""


@dataclass
class Policy:
    """Who answers: generators serving one weight version."""

    client: Any
    """A rl.serving.client.GeneratorClient."""
    version: int
    max_len: int
    """Their context length: prompt and replies fit in it."""
    how: str
    """`live` (the run's generators) or `own` (an engine started here)."""


def with_changes(agent: AgentConfig, changes: dict[str, Any]) -> AgentConfig:
    """The agent with some fields changed (`sarl eval --max-tokens ...`), validated."""
    from pydantic import ValidationError

    try:
        return AgentConfig.model_validate({**agent.model_dump(), **changes})
    except ValidationError as e:
        raise EvalError(f"agent: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}") from None


ENGINE_FOLDER = ".engine-"
"""An own engine's private folder in the run directory: `.engine-HOST-PID-XXXX`."""


def sweep_engine_folders(run_dir: Path) -> list[Path]:
    """Delete the private folders that evals killed before they could
    clean up (SIGKILL) left in `run_dir`: those whose process is gone from
    this host. Another host's, or a live one's, are left."""
    swept = []
    for d in run_dir.glob(f"{ENGINE_FOLDER}*"):
        host_pid = d.name[len(ENGINE_FOLDER) :].rpartition("-")[0]  # less tempfile's suffix
        host, _, pid = host_pid.rpartition("-")
        if pid.isdigit() and gone(host, int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            swept.append(d)
    return swept


class OwnEngine:
    """An engine started here, serving through the product's generator
    service and client, announced in a folder of its own (never the run's
    endpoints, where rollout workers would find it). `serve(version)` swaps
    weights between batches, as a generator does."""

    def __init__(self, ctx: RunContext, engine_cfg: Any):
        self.ctx, self.engine_cfg = ctx, engine_cfg
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> OwnEngine:
        from rl.engine import make_engine
        from rl.serving.client import GeneratorClient
        from rl.serving.inprocess import serving

        engine = make_engine(self.engine_cfg, self.ctx.model, seed=self.ctx.seed)
        self.stack.callback(engine.close)
        sweep_engine_folders(self.ctx.run_dir)
        folder = tempfile.TemporaryDirectory(prefix=f"{ENGINE_FOLDER}{tag()}-", dir=self.ctx.run_dir)
        private = Path(self.stack.enter_context(folder))
        self.server = self.stack.enter_context(serving(engine, private))
        # the engine is this process's own: a slow reply is a busy engine, not a lost node (every
        # episode of a large eval may be queued at once), so the client waits as long as it takes
        self.client = GeneratorClient(private, max_inflight=64, timeout_s=6 * 3600)
        return self

    def serve(self, version: int) -> Policy:
        """Load `version` (0: the base model) and answer with it."""
        from rl.store import Store

        if version != self.server.health()["version"]:
            store = Store.of_run(self.ctx.run_dir)
            with store.weights.pinned_while(f"eval-{os.getpid()}", version):
                self.server.swap(str(store.path), version)
        return Policy(self.client, version, self.engine_cfg.max_model_len, "own")

    def __exit__(self, *exc: Any) -> None:
        self.stack.close()


@contextlib.contextmanager
def policy(ctx: RunContext, version: int, choice: str, own_engine: Any, live_max_len: int | None) -> Iterator[Policy]:
    """The run's live generators when they all serve `version` (choice auto
    or live; `live_max_len`: their context length, None when the run has
    none), else an engine started here (auto or own) on `own_engine`."""
    from rl.serving.announcements import read_endpoints
    from rl.serving.client import GeneratorClient

    live = read_endpoints(ctx.run_dir, stale_s=30, now=time.time()) if live_max_len is not None else []
    if choice != "own" and live and all(e.version == version for e in live):
        assert live_max_len is not None
        yield Policy(GeneratorClient(ctx.run_dir, max_inflight=64), version, live_max_len, "live")
        return
    if choice == "live":
        served = sorted({e.version for e in live})
        raise EvalError(f"no live generator serves version {version} (live ones serve {served or 'nothing'})")
    with OwnEngine(ctx, own_engine) as own:
        yield own.serve(version)


def evaluate(
    ctx: RunContext,
    plans: list[Plan],
    version: int | None,
    choice: str,
    own_engine: Any,
    live_max_len: int | None,
    progress: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """`sarl eval`: one version (None: the newest) on live generators or an
    engine of its own (see `policy`), each plan in turn on the same engine:
    greedy and sampled, or several task files, cost one engine start (40-75
    s for vLLM on 2 cores, docs/benchmarks.md). A summary a plan, in order."""
    from rl.store import Store

    weights = Store.of_run(ctx.run_dir).weights
    if version is None:
        version = weights.latest() or 0
    if version > 0 and version not in weights.versions():
        raise EvalError(f"--version {version}: not in the store (it has {weights.versions() or 'none'})")
    with policy(ctx, version, choice, own_engine, live_max_len) as p:
        return [play(ctx, plan, p, progress) for plan in plans]


def one_episode(ctx: RunContext, agent: AgentConfig, task: Task, client: Any, max_len: int) -> tuple[Any, int]:
    """One episode of `task` through the run's live generators (`sarl
    generate --task`): the same loop, agent and environment as rollouts and
    evaluation. Returns the Episode and the weight version that answered."""
    from rl.episodes.episode import run_episode
    from rl.model import checkpoint, load_tokenizer
    from rl.verify.verifier import Verifier
    from sandboxes import open_sandbox

    versions: list[int] = []

    def generate(prompt: list[int], params: Any) -> tuple[Any, int]:
        r = client.generate([prompt], params)
        versions.append(r.version)
        return r.outputs[0][0], r.version

    tokenizer = load_tokenizer(checkpoint(ctx.model))
    with open_sandbox(ctx.sandbox) as sb, Verifier(ctx.verify, sandbox=ctx.sandbox) as verifier:
        ep = run_episode(task, agent, generate, tokenizer, sb, verifier, max_len, None, eval_seed(task.task_id, 0))
    return ep, max(versions, default=-1)


def play(ctx: RunContext, plan: Plan, policy: Policy, progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """n episodes of each task against `policy`; the results and summary
    written under RUN_DIR/eval/."""
    from rl.episodes.episode import run_episode
    from rl.model import checkpoint, load_tokenizer
    from rl.verify.verifier import Verifier
    from sandboxes.pool import WarmPool

    n, ks, agent, version = plan.n, sorted({k for k in plan.ks if k <= plan.n}) or [1], plan.agent, policy.version
    tokenizer = load_tokenizer(checkpoint(ctx.model))
    t0 = time.monotonic()
    stopping = threading.Event()  # set on an error, ^C or SIGTERM: episodes in flight end at their next reply
    with (
        WarmPool(ctx.sandbox, size=min(plan.concurrency, 4)) as pool,
        Verifier(ctx.verify, sandbox=ctx.sandbox) as verifier,
        ThreadPoolExecutor(plan.concurrency) as ex,
    ):

        def generate(prompt: list[int], params: Any) -> tuple[Any, int]:
            if stopping.is_set():
                raise EvalError("stopped")
            r = policy.client.generate([prompt], params)
            if r.version != version:
                raise EvalError(f"a generator answered with version {r.version} while version {version} was evaluated")
            return r.outputs[0][0], r.version

        def one(task: Task, i: int) -> dict[str, Any]:
            sb = pool.take()
            try:
                seed = eval_seed(task.task_id, i)
                ep = run_episode(task, agent, generate, tokenizer, sb, verifier, policy.max_len, None, seed)
            except BaseException:
                sb.close()
                raise
            pool.give(sb)
            if progress is not None:
                progress()
            return episode_record(task, i, ep, tokenizer)

        futures = {t.task_id: [ex.submit(one, t, i) for i in range(n)] for t in plan.tasks}
        results, episodes = [], []
        try:
            for t in plan.tasks:
                got = [f.result() for f in futures[t.task_id]]
                calls = [_tool_counts(e) for e in got]
                passed, whys = [e["passed"] for e in got], [e["failure"] for e in got]
                turns, rewards = [e["turns"] for e in got], [e["reward"] for e in got]
                results.append(task_result(t, passed, whys, turns, ks, calls, rewards))
                episodes += got
        except BaseException:  # an error, ^C or SIGTERM: the episodes not started yet are not played,
            stopping.set()  # and those in flight end at their next reply instead of playing out
            ex.shutdown(wait=False, cancel_futures=True)
            raise
    return _write_results(ctx, plan, policy, results, episodes, ks, (time.monotonic() - t0) / 60)


def _tool_counts(e: dict[str, Any]) -> tuple[int, int, int]:
    """An episode record's tool calls: all, invalid, answered with an error."""
    from rl.agent.tools import INVALID_CALLS

    f = e["tool_failures"]
    return e["tool_calls"], sum(f.get(w, 0) for w in INVALID_CALLS), f.get("tool-error", 0)


def episode_record(task: Task, sample: int, ep: Any, tokenizer: Any) -> dict[str, Any]:
    """What an evaluated episode did: its outcome, from which the task's
    results are counted, and its transcript after the prompt (the policy's
    replies and what the environment answered, as the model saw them), to
    be read when a figure surprises."""
    from rl.episodes.samples import failure_of

    why = failure_of(ep)
    mask = ep.trajectory.loss_mask
    first = mask.index(1) if 1 in mask else len(mask)  # the prompt, the same for every sample, is left out
    return {
        "task_id": task.task_id,
        "sample": sample,
        "passed": why == "",
        "failure": why,
        "reward": float(ep.verdict.reward) if ep.verdict is not None else 0.0,
        "turns": ep.turns,
        "end": ep.end,
        "tool_calls": ep.tool_calls,
        "tool_failures": dict(ep.tool_failures),
        "transcript": tokenizer.decode(ep.trajectory.tokens[first:]),
    }


def _write_results(
    ctx: RunContext,
    plan: Plan,
    policy: Policy,
    results: list[Any],
    episodes: list[dict[str, Any]],
    ks: list[int],
    minutes: float,
) -> dict[str, Any]:
    """results.jsonl (a line a task), episodes.jsonl (a line an episode, with
    its transcript) and summary.json in the folder of the version, the task
    file and the mode (greedy or sampled, the turns): the summary, with that
    folder."""
    tasks_file = str(Path(plan.tasks_name).resolve())
    summary = {"version": policy.version, "tasks_file": tasks_file, "n": plan.n, "engine": policy.how}
    summary.update(summarise(results, ks))
    summary["minutes"] = round(minutes, 2)
    summary["temperature"] = plan.agent.temperature
    mode = play_mode(plan.agent.temperature, plan.n, plan.agent.max_turns)
    folder = results_folder(Path(ctx.run_dir) / "eval" / f"v{policy.version:06d}", tasks_file, mode)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "results.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in results))
    atomic_write(folder / "episodes.jsonl", "".join(json.dumps(e) + "\n" for e in episodes))
    atomic_write(folder / "summary.json", json.dumps(summary, indent=1) + "\n")
    summary["folder"] = str(folder)
    return summary
