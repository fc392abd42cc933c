"""One rollout worker: an outline.

    groups = my share of the run's groups (k, k + N, k + 2N, ...)
    done   = the groups my committed batches hold (read from the store: it,
             not my state file, is the truth) + the groups I abandoned
    for each group not done, as capacity allows (staleness bound):
        play group_size episodes, `concurrency` at a time, retrying
        infrastructure failures
    every `batch_groups` complete groups: commit one batch

Exactly once: a group is committed in one batch or recorded as abandoned
with its reason. A worker killed at any instant loses only the groups it had
in flight, and plays them again when it starts over: they were never
committed. The writer id is the worker's (`rollout-NNNNNN`), and batch
sequence numbers come from the store, so a batch is never written twice.

The task of group g is fixed by the run's seed and g alone, so the group
played again after a restart is the same task (the pool's priorities, when
they land, must keep this property).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl.config import Config
from rl.rollout.config import RolloutRole
from rl.rollout.episode import Episode, run_episode
from rl.store import Sample, Store
from rl.tasks.format import Task, read_tasks

log = logging.getLogger("sarl.rollout")

POLICY_FAILURES = ("wrong-answer", "no-code", "crash", "timeout", "limit", "deadline", "token-budget", "verifier")
"""Why a scored episode did not pass (its reward stands, it is trained on)."""
INFRA_FAILURES = ("no-generator", "sandbox", "generator-error")
"""Why an episode could not be played; retried, never trained on."""


class InfraFailure(Exception):
    """The episode could not be played for a reason that is not the policy's."""


def failure_of(ep: Episode) -> str:
    """The reason from the fixed vocabulary, empty when the episode passed."""
    v = ep.verdict
    if v is None or v.failure.startswith("verifier error"):
        return "verifier"
    if v.passed:
        return ""
    if not ep.completion.strip():
        return "no-code"
    if ep.end in ("deadline", "token-budget"):
        return ep.end
    why = v.failure
    if why.startswith("limit hit"):
        return "limit"
    if "timeout" in why:
        return "timeout"
    if "did not load" in why or "crash" in why or "Error" in why:
        return "crash"
    return "wrong-answer"


@dataclass
class GroupResult:
    group: int
    task: Task
    episodes: list[Episode]


def plan(tasks: list[Task], seed: int, group: int) -> Task:
    """The task of `group`: a function of the seed and the group number only."""
    return tasks[random.Random(f"{seed}/{group}").randrange(len(tasks))]


def committed_groups(store: Store, writer: str) -> set[int]:
    """The groups this writer's committed batches hold."""
    reader = store.reader()
    out: set[int] = set()
    for w, seq in reader.committed():
        if w == writer:
            out |= {int(g) for g in reader.read((w, seq), verify=False).group_id}
    return out


def to_samples(result: GroupResult) -> list[Sample]:
    out = []
    for ep in result.episodes:
        a = ep.trajectory.arrays()
        sampled = a["versions"][a["versions"] >= 0]
        out.append(
            Sample(
                task_id=result.task.task_id,
                group_id=result.group,
                policy_version=int(sampled.min()) if sampled.size else 0,
                tokens=a["tokens"],
                loss_mask=a["loss_mask"],
                logprobs=a["logprobs"],
                reward=float(ep.verdict.reward) if ep.verdict is not None else 0.0,
                checks=ep.verdict.sample_checks(),
                timings={k: round(v, 4) for k, v in ep.timings.items()},
                failure=failure_of(ep),
                versions=a["versions"],
            )
        )
    return out


class Worker:
    """Plays this worker's groups and commits them; `progress(**state)` is
    called with what the role's state should record."""

    def __init__(self, run_dir: Any, cfg: Config, role_cfg: RolloutRole, index: int, progress: Callable[..., None]):
        self.cfg, self.rc, self.index, self.progress = cfg, role_cfg, index, progress
        self.store = Store.of_run(run_dir)
        self.run_dir = run_dir
        self.writer_id = f"rollout-{index:06d}"
        self.tasks = list(read_tasks(role_cfg.tasks_file))
        self.started = time.monotonic()
        self.tb: Any = None

    def my_groups(self) -> list[int]:
        return list(range(self.index, self.rc.groups, self.rc.tasks))

    def run(self, abandoned: dict[str, str]) -> dict[str, Any]:
        from rl.generator.client import GeneratorClient
        from rl.model import checkpoint, load_tokenizer
        from rl.verify.verifier import Verifier
        from sandboxes.pool import WarmPool

        tokenizer = load_tokenizer(checkpoint(self.cfg.model))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(self.run_dir) / "tb" / self.writer_id))
        except ImportError:
            log.warning("tensorboard is not installed: no curves for this worker")
        client = GeneratorClient(self.run_dir, max_inflight=self.rc.concurrency)
        writer = self.store.writer(self.writer_id)
        done = committed_groups(self.store, self.writer_id) | {int(g) for g in abandoned}
        todo = [g for g in self.my_groups() if g not in done]
        log.info("worker %d: %d groups to play, %d done", self.index, len(todo), len(done))
        stats: dict[str, Any] = {"episodes": 0, "retries": 0, "dropped_groups": 0, "failures": {}}
        self.committed = committed_groups(self.store, self.writer_id)
        pending: list[GroupResult] = []
        max_len = self._max_model_len()
        with (
            WarmPool(self.cfg.sandbox, size=min(self.rc.concurrency, 4)) as pool,
            Verifier(self.cfg.verify, sandbox=self.cfg.sandbox) as verifier,
            ThreadPoolExecutor(self.rc.concurrency) as ex,
        ):

            def episode(task: Task, group: int, i: int) -> Episode:
                return self._episode(task, group, i, client, tokenizer, pool, verifier, max_len, stats)

            inflight: dict[Future[Episode], tuple[int, int]] = {}
            groups: dict[int, list[Episode | None]] = {}
            queue = list(todo)
            while queue or inflight:
                while queue and len(inflight) < self.rc.concurrency and self._may_start(queue[0]):
                    g = queue.pop(0)
                    task = plan(self.tasks, self.cfg.run.seed, g)
                    groups[g] = [None] * self.rc.group_size
                    for i in range(self.rc.group_size):
                        inflight[ex.submit(episode, task, g, i)] = (g, i)
                if not inflight:
                    time.sleep(1.0)  # waiting for the learner (staleness bound)
                    continue
                finished, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
                for f in finished:
                    g, i = inflight.pop(f)
                    try:
                        groups[g][i] = f.result()
                    except InfraFailure as e:  # retries exhausted: the whole group is abandoned
                        abandoned[str(g)] = str(e)
                        self.progress(abandoned=dict(abandoned))
                        groups[g] = []
                        for other in [x for x, (gg, _) in inflight.items() if gg == g]:
                            other.cancel()
                        continue
                    if groups[g] and all(e is not None for e in groups[g]):
                        result = GroupResult(g, plan(self.tasks, self.cfg.run.seed, g), groups.pop(g))  # type: ignore[arg-type]
                        rewards = [e.verdict.reward for e in result.episodes]
                        if self.rc.dynamic_sampling and len(set(rewards)) <= 1:
                            stats["dropped_groups"] += 1
                            abandoned[str(g)] = "dynamic sampling: every reward equal"
                            self.progress(abandoned=dict(abandoned))
                            continue
                        pending.append(result)
                if len(pending) >= self.rc.batch_groups or (pending and not queue and not inflight):
                    self._commit(writer, pending, stats)
                    pending = []
        if self.tb is not None:
            self.tb.close()
        return {"worker": self.index, **stats, "abandoned": len(abandoned)}

    # ------------------------------------------------------------------ parts
    def _max_model_len(self) -> int:
        gen = self.cfg.generator
        return gen.engine.max_model_len if gen is not None else 4096

    def _may_start(self, group: int) -> bool:
        """The staleness bound: never more than max_staleness steps ahead of the learner."""
        if not self.rc.groups_per_step:
            return True
        v = self.store.weights.latest() or 0
        return group < (self.rc.max_staleness + v + 1) * self.rc.groups_per_step

    def _episode(
        self,
        task: Task,
        group: int,
        i: int,
        client: Any,
        tokenizer: Any,
        pool: Any,
        verifier: Any,
        max_len: int,
        stats: dict[str, Any],
    ) -> Episode:
        from rl.generator.client import NoGenerator
        from sandboxes import SandboxError

        def generate(prompt: list[int], params: Any) -> Any:
            r = client.generate([prompt], params)
            return r.outputs[0][0], r.version

        seed = hash((self.cfg.run.seed, group, i)) & 0x7FFFFFFF
        for attempt in range(self.rc.max_retries + 1):
            sb = None
            try:
                sb = pool.take()
                deadline = time.monotonic() + self.rc.episode_deadline_s
                ep = run_episode(task, self.rc.agent, generate, tokenizer, sb, verifier, max_len, deadline, seed)
                pool.give(sb)
                stats["episodes"] += 1
                why = failure_of(ep)
                stats["failures"][why or "passed"] = stats["failures"].get(why or "passed", 0) + 1
                return ep
            except (NoGenerator, SandboxError) as e:
                if sb is not None:
                    sb.close()
                stats["retries"] += 1
                kind = "no-generator" if isinstance(e, NoGenerator) else "sandbox"
                log.warning("group %d episode %d: %s (attempt %d): %s", group, i, kind, attempt + 1, e)
                if attempt == self.rc.max_retries:
                    raise InfraFailure(f"{kind}: {e}") from None
                time.sleep(min(30.0, 2.0**attempt))
        raise AssertionError("unreachable")

    def _commit(self, writer: Any, results: list[GroupResult], stats: dict[str, Any]) -> None:
        samples = [s for r in results for s in to_samples(r)]
        seq = writer.next_seq()
        writer.write(seq, samples)
        self.committed |= {r.group for r in results}
        rewards = np.array([s.reward for s in samples])
        log.info("committed batch %d: %d groups, mean reward %.3f", seq, len(results), float(rewards.mean()))
        self._curves(seq, results, samples, stats)
        self.progress(
            batches=seq + 1,
            groups_committed=len(self.committed),
            episodes=stats["episodes"],
            retries=stats["retries"],
            failures=dict(stats["failures"]),
        )

    def _curves(self, seq: int, results: list[GroupResult], samples: list[Sample], stats: dict[str, Any]) -> None:
        """TensorBoard (`RUN/tb/rollout-NNNNNN/`). The step is the episodes this
        worker has committed, read from the store at start: it never goes back
        after a restart."""
        if self.tb is None:
            return
        step = len(self.committed) * self.rc.group_size
        episodes = [e for r in results for e in r.episodes]
        tb = self.tb
        tb.add_scalar("rollout/episodes_per_s", stats["episodes"] / max(1e-9, time.monotonic() - self.started), step)
        tb.add_histogram("rollout/reward", np.array([s.reward for s in samples]), step)
        tb.add_scalar("rollout/reward_mean", float(np.mean([s.reward for s in samples])), step)
        for name in samples[0].checks:
            vals = [s.checks[name] for s in samples if not np.isnan(s.checks[name])]
            if vals:
                tb.add_scalar(f"rollout/check/{name}", float(np.mean(vals)), step)
        for why, n in stats["failures"].items():
            tb.add_scalar(f"rollout/failures/{why}", n, step)
        tb.add_scalar("rollout/turns", float(np.mean([e.turns for e in episodes])), step)
        tb.add_scalar("rollout/tokens", float(np.mean([len(e.trajectory) for e in episodes])), step)
        for t in ("generate_s", "execute_s", "verify_s"):
            tb.add_scalar(f"rollout/time/{t}", float(np.mean([e.timings.get(t, 0.0) for e in episodes])), step)
        tb.add_scalar("rollout/retries", stats["retries"], step)
        latest = self.store.weights.latest() or 0
        versions = [s.policy_version for s in samples]
        tb.add_scalar("rollout/staleness", float(latest - min(versions)), step)
        tb.add_scalar("rollout/batches", seq + 1, step)
        tb.flush()
