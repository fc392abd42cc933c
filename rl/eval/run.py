"""Evaluate one weight version of a run on a task file: `sarl eval`.

    the policy = live generators serving the version, or an engine started
                 here with the version loaded (version 0: the base model)
    for each task, n episodes with the rollouts' agent (rl.rollout.episode:
        the same prompts, turns, sandboxes and verifier), seeds fixed by
        (task, sample)
    pass@k per task (rl.eval.passk), their means with standard errors
    -> RUN_DIR/eval/v<version>/<tasks>/results.jsonl (one line per task)
       and summary.json, each written whole

An engine started here serves through the product's own generator service
and client, announced in a folder of its own (never the run's endpoints,
where rollout workers would find it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl.errors import SarlError
from rl.eval.passk import mean_and_se, pass_at_k
from rl.fsio import atomic_write
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
    """Why samples failed, by reason (rl.rollout.samples vocabulary)."""
    turns_mean: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)


def eval_seed(task_id: str, i: int) -> int:
    return int.from_bytes(hashlib.sha256(f"eval/{task_id}/{i}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def summarise(results: list[TaskResult], ks: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"tasks": len(results), "samples": sum(r.n for r in results)}
    for k in ks:
        m, se = mean_and_se([r.pass_at[f"pass@{k}"] for r in results if f"pass@{k}" in r.pass_at])
        out[f"pass@{k}"], out[f"se@{k}"] = round(m, 4), round(se, 4)
    fails: Counter[str] = Counter()
    for r in results:
        fails.update(r.failures)
    out["failures"] = dict(sorted(fails.items()))
    return out


def task_result(task: Task, passed: list[bool], failures: list[str], turns: list[int], ks: list[int]) -> TaskResult:
    n, c = len(passed), sum(passed)
    return TaskResult(
        task.task_id,
        n,
        c,
        {f"pass@{k}": round(pass_at_k(n, c, k), 6) for k in ks if k <= n},
        dict(Counter(f for f in failures if f)),
        round(sum(turns) / max(1, len(turns)), 3),
        {k: task.metadata[k] for k in ("family", "difficulty") if k in task.metadata},
    )


class OwnEngine:
    """An engine started here, serving through the product's generator
    service and client, announced in a folder of its own (never the run's
    endpoints, where rollout workers would find it). `serve(version)` swaps
    weights between batches, as a generator does."""

    def __init__(self, run_dir: Path, cfg: Any, engine_cfg: Any = None):
        from rl.engine.config import VLLMEngineConfig

        self.run_dir, self.cfg = Path(run_dir), cfg
        self.engine_cfg = engine_cfg or (cfg.generator.engine if cfg.generator is not None else VLLMEngineConfig())
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> OwnEngine:
        import tempfile

        from rl.engine import make_engine
        from rl.generator.client import GeneratorClient
        from rl.generator.inprocess import serving

        engine = make_engine(self.engine_cfg, self.cfg.model, seed=self.cfg.run.seed)
        self.stack.callback(engine.close)
        private = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix=".engine-", dir=self.run_dir)))
        self.server = self.stack.enter_context(serving(engine, private))
        # the engine is this process's own: a slow reply is a busy engine, not a lost node (every
        # episode of a large eval may be queued at once), so the client waits as long as it takes
        self.client = GeneratorClient(private, max_inflight=64, timeout_s=6 * 3600)
        return self

    def serve(self, version: int) -> None:
        from rl.store import Store

        if version == self.server.health()["version"]:
            return
        store = Store.of_run(self.run_dir)
        holder = f"eval-{os.getpid()}"
        store.weights.pin(holder, version)  # retention keeps it while it loads
        try:
            self.server.swap(str(store.path), version)
        finally:
            store.weights.unpin(holder)

    def __exit__(self, *exc: Any) -> None:
        self.stack.close()


@contextlib.contextmanager
def _policy(
    run_dir: Path, cfg: Any, version: int, engine_choice: str, backend: str | None = None
) -> Iterator[tuple[Any, str, int]]:
    """(a GeneratorClient on generators serving `version`, which, their
    max_model_len): the run's live ones when they all serve it
    (engine_choice auto or live), else an engine started here (auto or own)."""
    from rl.generator.client import GeneratorClient
    from rl.generator.endpoint import read_endpoints

    live = read_endpoints(run_dir, stale_s=30, now=time.time())
    if engine_choice != "own" and live and all(e.version == version for e in live):
        yield GeneratorClient(run_dir, max_inflight=64), "live", cfg.generator.engine.max_model_len
        return
    if engine_choice == "live":
        served = sorted({e.version for e in live})
        raise EvalError(f"no live generator serves version {version} (live ones serve {served or 'nothing'})")
    engine_cfg = None
    if backend is not None:  # else the run's generator engine, or vLLM
        from rl.engine.config import HFEngineConfig, VLLMEngineConfig

        engine_cfg = HFEngineConfig() if backend == "hf" else VLLMEngineConfig()
    with OwnEngine(run_dir, cfg, engine_cfg) as own:
        if version > 0:
            own.serve(version)
        yield own.client, "own", own.engine_cfg.max_model_len


def eval_agent(cfg: Any) -> Any:
    """The agent an evaluation plays: `[eval] agent`, else the rollouts', else the default."""
    from rl.agent.config import AgentConfig

    if cfg.eval is not None and cfg.eval.agent is not None:
        return cfg.eval.agent
    return cfg.rollout.agent if cfg.rollout is not None else AgentConfig()


def evaluate(
    run_dir: Path,
    tasks: list[Task],
    tasks_name: str,
    version: int | None = None,
    n: int = 1,
    ks: list[int] | None = None,
    concurrency: int = 8,
    engine: str = "auto",
    progress: Callable[[], None] | None = None,
    agent: dict[str, Any] | None = None,
    backend: str | None = None,
) -> dict[str, Any]:
    """`sarl eval`: one version, on live generators or an engine of its own
    (`backend` vllm or hf; default: the run's generator engine, else vLLM);
    `agent` changes fields of the agent played (max_tokens, ...)."""
    from rl.run.rundir import RunDir
    from rl.store import Store

    rd = RunDir(run_dir)
    cfg = rd.config()
    weights = Store.of_run(run_dir).weights
    if version is None:
        version = weights.latest() or 0
    if version > 0 and version not in weights.versions():
        raise EvalError(f"--version {version}: not in the store (it has {weights.versions() or 'none'})")
    with _policy(rd.path, cfg, version, engine, backend) as (client, how, max_len):
        return play(rd.path, cfg, client, how, max_len, tasks, tasks_name, version, n, ks, concurrency, progress, agent)


def play(
    run_dir: Path,
    cfg: Any,
    client: Any,
    how: str,
    max_len: int,
    tasks: list[Task],
    tasks_name: str,
    version: int,
    n: int,
    ks: list[int] | None,
    concurrency: int,
    progress: Callable[[], None] | None = None,
    agent_changes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """n episodes of each task against `client` serving `version`; the
    results and summary written under RUN_DIR/eval/."""
    from rl.model import checkpoint, load_tokenizer
    from rl.rollout.episode import run_episode
    from rl.rollout.samples import failure_of
    from rl.verify.verifier import Verifier
    from sandboxes.pool import WarmPool

    ks = sorted({k for k in (ks or [1]) if k <= n}) or [1]
    agent = eval_agent(cfg)
    if agent_changes:
        from pydantic import ValidationError

        try:
            agent = type(agent).model_validate({**agent.model_dump(), **agent_changes})
        except ValidationError as e:
            raise EvalError(f"agent: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}") from None
    tokenizer = load_tokenizer(checkpoint(cfg.model))
    t0 = time.monotonic()
    with (
        WarmPool(cfg.sandbox, size=min(concurrency, 4)) as pool,
        Verifier(cfg.verify, sandbox=cfg.sandbox) as verifier,
        ThreadPoolExecutor(concurrency) as ex,
    ):

        def generate(prompt: list[int], params: Any) -> tuple[Any, int]:
            r = client.generate([prompt], params)
            if r.version != version:
                raise EvalError(f"a generator answered with version {r.version} while version {version} was evaluated")
            return r.outputs[0][0], r.version

        def one(task: Task, i: int) -> tuple[bool, str, int]:
            sb = pool.take()
            try:
                seed = eval_seed(task.task_id, i)
                ep = run_episode(task, agent, generate, tokenizer, sb, verifier, max_len, None, seed)
            except BaseException:
                sb.close()
                raise
            pool.give(sb)
            if progress is not None:
                progress()
            why = failure_of(ep)
            return why == "", why, ep.turns

        futures = {t.task_id: [ex.submit(one, t, i) for i in range(n)] for t in tasks}
        results = []
        for t in tasks:
            got = [f.result() for f in futures[t.task_id]]
            results.append(task_result(t, [g[0] for g in got], [g[1] for g in got], [g[2] for g in got], ks))
    summary = {"version": version, "tasks_file": tasks_name, "n": n, "engine": how, **summarise(results, ks)}
    summary["minutes"] = round((time.monotonic() - t0) / 60, 2)
    summary["temperature"] = agent.temperature
    folder = Path(run_dir) / "eval" / f"v{version:06d}" / Path(tasks_name).name.removesuffix(".jsonl")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "results.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in results))
    atomic_write(folder / "summary.json", json.dumps(summary, indent=1) + "\n")
    summary["folder"] = str(folder)
    return summary
