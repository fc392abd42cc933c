"""One rollout worker's parts (the outline is rl.rollout.loop): the groups
it plays, the episodes it runs on a thread pool, `concurrency` at a time,
the complete groups it commits; `Worker.flush` commits the complete groups
on USR2. When a group may start is rl.rollout.gate, the policy an episode
calls rl.rollout.generation, how groups are cut into batches
rl.rollout.batches.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from rl.context import RunContext
from rl.episodes.episode import Episode, run_episode
from rl.episodes.samples import GroupResult, failure_of, to_samples
from rl.fsio import read_json
from rl.rollout.batches import committed_groups, due
from rl.rollout.config import RolloutRole
from rl.rollout.curves import RolloutCurves
from rl.rollout.endings import Abandon, InfraFailure, Stopping
from rl.rollout.gate import GATE_POLL_S, gate
from rl.rollout.generation import episode_policy, episode_seed
from rl.rollout.group_request import GroupReplies
from rl.rollout.harness import EndpointFailed, run_harness
from rl.rollout.queue import TaskQueue
from rl.rollout.stats import Stats
from rl.store import Store
from rl.tasks.format import Task
from rl.tasks.quarantine import quarantine

log = logging.getLogger("sarl.rollout")


SHARES_POLL_S = 2.0
"""How often a playing worker looks for a share handed to it (a few small files)."""


class Worker:
    """Plays this worker's groups and commits them, in the run context
    `ctx`: its state holds `planned` (group -> task id) and `abandoned`
    (group -> reason); `ctx.save` commits them, `ctx.beat` is a sign of
    life (`inflight=`, `pending=`), `ctx.progressed` says that the loop
    advanced (an episode ended) or waits on the learner (rl.run.recovery's
    stall check), and `ctx.stopping` is set on USR2."""

    def __init__(self, ctx: RunContext, rc: RolloutRole):
        if rc.max_model_len is None:
            raise ValueError("rollout.max_model_len is resolved from generator.engine: validate the whole config")
        self.ctx, self.rc, self.index = ctx, rc, ctx.task
        self.save, self.beat, self.progressed = ctx.save, ctx.beat, ctx.progressed
        self.run_dir = ctx.run_dir
        self.store = Store.of_run(ctx.run_dir)
        self.writer_id = f"rollout-{self.index:06d}"
        state = ctx.state
        self.planned: dict[int, str] = {int(g): t for g, t in state.get("planned", {}).items()}
        self.abandoned: dict[int, str] = {int(g): r for g, r in state.get("abandoned", {}).items()}
        self.queue = TaskQueue(rc.tasks_file, rc.weights(), ctx.seed, ctx.run_dir, rc.group_size)
        self.stats = Stats()
        self.stopping = ctx.stopping
        self.pending: list[GroupResult] = []
        """Complete groups not committed yet."""
        self.inflight: dict[Future[Episode], tuple[int, int]] = {}
        """Episodes running, as (group, index)."""
        self.groups: dict[int, list[Episode | None]] = {}
        """Groups started and not complete: their episodes so far."""
        self.committed: set[int] = set()
        self._lock = threading.Lock()
        """Held while the groups change or a batch is written: a USR2 flush waits for it."""
        self._loop_thread: int | None = None
        self._flushed = False
        self._beat_at = 0.0
        self.loop_s = 0.0
        self._writer: Any = None
        self._curves: RolloutCurves | None = None
        self.gateway: Any = None
        """The OpenAI endpoint of harness episodes (rollout.agent.harness), else None."""
        self.shares = [self.index]
        """The shares of the groups this worker plays: its own, and those handed to it."""
        self.abandoned_before: set[int] = set()
        """Groups that a given-up worker, whose share this one plays, abandoned."""
        self._shares_read = 0.0

    def my_groups(self) -> list[int]:
        return sorted(g for k in self.shares for g in range(k, self.rc.groups, self.rc.workers))

    def take_up(self) -> list[int]:
        """Shares handed to this worker since it last looked (rl.rollout.shares):
        their groups to play, with the tasks their first worker planned."""
        from rl.rollout import shares

        self._shares_read = time.monotonic()
        rd = self.ctx.layout
        now = shares.shares_of(rd, self.index, self.rc.workers)
        new = [k for k in now if k not in self.shares]
        self.shares = now
        for k in new:
            if k == self.index:
                continue
            peer = read_json(rd.state_path("rollout", k)) or {}
            for g, t in peer.get("planned", {}).items():
                self.planned.setdefault(int(g), t)
            self.abandoned_before |= {int(g) for g in peer.get("abandoned", {})}
            log.warning("worker %d takes up the share of given-up worker %d", self.index, k)
        if new:  # the store, read now: what the share's first worker committed after I started
            self.committed |= committed_groups(self.store)
        gone = self.committed | set(self.abandoned) | self.abandoned_before
        return [g for k in new for g in range(k, self.rc.groups, self.rc.workers) if g not in gone]

    # ------------------------------------------------------ what the loop does
    @contextlib.contextmanager
    def playing(self) -> Iterator[None]:
        """Everything the worker plays with, open for the loop: the generator
        client, the batch writer and its curves, the groups the store holds,
        the OpenAI endpoint of harness programs, warm sandboxes, the
        verifier, the episode threads."""
        from rl.model import checkpoint, load_tokenizer
        from rl.serving.client import GeneratorClient
        from rl.verify.verifier import Verifier
        from sandboxes.pool import WarmPool

        self.tokenizer = load_tokenizer(checkpoint(self.ctx.model))
        self.client = GeneratorClient(
            self.run_dir,
            max_inflight=self.rc.concurrency,
            wait_for_generator_s=self.rc.generator_wait_s,
            stop=self.stopping,  # a USR2 ends its waits: the requeue is not held back
        )
        self._writer = self.store.writer(self.writer_id)
        self.store.given_up.sweep()
        harness = self.rc.agent.harness is not None
        self._curves = RolloutCurves(self.ctx.layout.tb(self.writer_id), self.rc.group_size, harness)
        self.committed = committed_groups(self.store)
        self.shares = []  # the first take_up finds them all, this worker's own included
        self.started = time.monotonic()
        self.gateway = self._gateway() if harness else None
        sandbox = self.ctx.sandbox
        if self.gateway is not None:  # a harness program reaches its endpoint, and nothing else
            sandbox = sandbox.model_copy(update={"network": [*sandbox.network, f"127.0.0.1:{self.gateway.port}"]})
        with (
            self.gateway if self.gateway is not None else contextlib.nullcontext(),
            WarmPool(sandbox, size=min(self.rc.concurrency, 4)) as self.pool,
            Verifier(self.ctx.verify, sandbox=self.ctx.sandbox) as self.verifier,
            ThreadPoolExecutor(self.rc.concurrency) as self.ex,
        ):
            yield
        self._curves.close()

    def finish_shares(self) -> None:
        """The worker played its shares to the end: they are done (rl.rollout.shares)."""
        from rl.rollout import shares

        shares.finish(self.ctx.layout, self.index, self.shares)

    def _gateway(self) -> Any:
        """The OpenAI endpoint that this worker's harness programs call,
        on this host's loopback, sampling through the generator client."""
        from rl.gateway.backends import ClientBackend
        from rl.gateway.capture import Sessions
        from rl.gateway.server import Gateway
        from rl.serving.announcements import run_secret

        assert self.rc.max_model_len is not None
        backend = ClientBackend(self.client, self.rc.max_model_len, len(self.tokenizer))
        # the endpoint's own key is the run's secret (an operator's); each program has its episode's key
        token = run_secret(self.run_dir)
        return Gateway(backend, self.tokenizer, model="policy", token=token, sessions=Sessions()).start()

    def shares_due(self) -> bool:
        """Time to look for shares handed to this worker again."""
        return time.monotonic() - self._shares_read > SHARES_POLL_S

    def on_loop_thread(self) -> None:
        """The loop runs on this thread (a USR2 flush on it must not wait for itself)."""
        self._loop_thread = threading.get_ident()

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """The loop changes the groups or commits: a USR2 flush waits for it to finish."""
        with self._lock:
            yield

    def wait_at_gate(self) -> None:
        """Nothing can start and nothing runs: the gate waits for the learner."""
        self.stats.count(gate_wait_s=GATE_POLL_S)
        time.sleep(GATE_POLL_S)

    def wait_for_episodes(self, gate_held: bool) -> set[Future[Episode]]:
        """The episodes that ended (played, retried out, or stopped), after a
        sign of life. A held gate is looked at again soon: a version
        published while episodes run lets the next groups start at once, not
        when one of them ends."""
        if time.monotonic() - self._beat_at > 2.0:
            self.beat(inflight=len(self.inflight), pending=len(self.pending))
            self._beat_at = time.monotonic()
        timeout = GATE_POLL_S if gate_held else 5.0
        finished, _ = wait(list(self.inflight), timeout=timeout, return_when=FIRST_COMPLETED)
        if finished:  # the loop advances
            self.progressed()
        return finished

    def start_groups(self, todo: list[int]) -> bool:
        """Start groups while there is room; True when the gate holds the next one back."""
        inflight, groups = self.inflight, self.groups
        while todo and len(inflight) < self.rc.concurrency and not self.stopping.is_set():
            g = todo[0]
            verdict = self._gate(g)
            if verdict == "wait":
                return True
            todo.pop(0)
            task = self._task_of(g) if verdict == "start" else None
            if task is None:
                continue  # abandoned, with its reason
            groups[g] = [None] * self.rc.group_size
            together = self.rc.group_request and self.rc.agent.harness is None  # a program asks by itself
            first = GroupReplies(self.rc.group_size, episode_seed(self.ctx.seed, g, -1)) if together else None
            for i in range(self.rc.group_size):
                inflight[self.ex.submit(self._episode, task, g, i, first)] = (g, i)
        return False

    def finish(self, f: Future[Episode]) -> None:
        """An episode ended: into its group; a complete group waits for its batch."""
        inflight, groups = self.inflight, self.groups
        g, i = inflight.pop(f)
        if g not in groups:
            return  # its group was abandoned already
        try:
            groups[g][i] = f.result()
        except Stopping:
            return
        except Abandon as e:  # the whole group goes; its other episodes are dropped
            groups.pop(g)
            for other in [x for x, (gg, _) in inflight.items() if gg == g]:
                other.cancel()
            self._abandon(g, str(e))
            return
        if all(e is not None for e in groups[g]):
            episodes: list[Episode] = groups.pop(g)  # type: ignore[assignment]
            result = GroupResult(g, self.queue.by_id[self.planned[g]], episodes)
            if self.rc.dynamic_sampling and len({e.verdict.reward for e in episodes}) <= 1:
                self.stats.count(dropped_groups=1)
                self._abandon(g, "dynamic sampling: every reward equal")
                return
            self.pending.append(result)

    # ------------------------------------------------------------ the parts
    def _gate(self, group: int) -> str:
        """`start`, `wait`, or `closed` (sync: the group's round has passed; it is given up)."""
        verdict, why = gate(self.store, group, self.rc.groups_per_step, self.ctx.sync, self.ctx.max_staleness)
        if verdict == "closed":
            self._abandon(group, why)
        return verdict

    def _task_of(self, g: int) -> Task | None:
        """The group's task: as planned before a restart, else drawn and recorded first."""
        tid = self.planned.get(g)
        if tid is not None and tid not in self.queue.by_id:
            self._abandon(g, f"task {tid!r} is no longer in the task files")
            return None
        if tid is None:
            uncommitted = {x for x in self.planned if x not in self.committed and x not in self.abandoned}
            task = self.queue.choose(g, self.planned, uncommitted)
            if task is None:
                self._abandon(g, "every task is quarantined")
                return None
            self.planned[g] = tid = task.task_id
            self.save(planned={str(k): v for k, v in self.planned.items()})
        why = self.queue.why_quarantined(tid)
        if why is not None:
            self._abandon(g, f"task quarantined: {why}")
            return None
        return self.queue.by_id[tid]

    def _abandon(self, g: int, reason: str) -> None:
        """Give up group `g`: in the store first (rl.store.given_up: what the
        learner and the other workers' gates count on), then in the state."""
        self.store.given_up.record(g, reason, self.writer_id)
        self.abandoned[g] = reason
        log.warning("group %d abandoned: %s", g, reason)
        self.save(abandoned={str(k): v for k, v in self.abandoned.items()})
        tid = self.planned.get(g)
        if tid is None or not reason.startswith(("sandbox", "environment")):
            return
        deaths = sum(
            1
            for x, r in self.abandoned.items()
            if r.startswith(("sandbox", "environment")) and self.planned.get(x) == tid
        )
        if deaths >= self.rc.quarantine_after and quarantine(
            self.run_dir,
            tid,
            f"{deaths} groups abandoned because their sandbox or environment failed; last: {reason}",
            self.writer_id,
        ):
            log.warning("task %s quarantined", tid)

    def _episode(self, task: Task, group: int, i: int, first: GroupReplies | None = None) -> Episode:
        from rl.agent.env import EnvironmentFailed
        from rl.serving.client import NoGenerator
        from sandboxes import SandboxError

        max_len = self.rc.max_model_len
        assert max_len is not None  # checked at construction
        for attempt in range(self.rc.max_retries + 1):
            round_version = group // self.rc.groups_per_step if self.ctx.sync else None
            generate, waited = episode_policy(self.client, i, round_version, first, self.stopping, self.stats.count)
            sb = None
            try:
                sb = self.pool.take()
                deadline = time.monotonic() + self.rc.episode_deadline_s
                seed = episode_seed(self.ctx.seed, group, i)
                agent = self.rc.agent
                if self.gateway is not None:
                    ep = run_harness(
                        task, agent, self.gateway, self.tokenizer, sb, self.verifier, deadline, seed, f"{group}/{i}"
                    )
                else:
                    ep = run_episode(
                        task, agent, generate, self.tokenizer, sb, self.verifier, max_len, deadline, seed, waited
                    )
                self.pool.give(sb)
                ep.episode_id = f"{group}/{i}"
                self.stats.count(episodes=1)
                self.stats.failed(failure_of(ep))
                return ep
            except EnvironmentFailed as e:  # the environment's code failed: not the policy's, never scored
                if sb is not None:
                    sb.close()
                log.warning("episode %d/%d: environment failed: %s", group, i, e)
                raise InfraFailure(f"environment: {e}") from None
            except (NoGenerator, SandboxError, EndpointFailed) as e:
                if sb is not None:
                    sb.close()
                if self.stopping.is_set():
                    raise Stopping() from None
                self.stats.count(retries=1)
                kind = "sandbox" if isinstance(e, SandboxError) else "no-generator"  # or the endpoint's
                log.warning("episode %d/%d: %s (attempt %d): %s", group, i, kind, attempt + 1, e)
                if attempt == self.rc.max_retries:
                    raise InfraFailure(f"{kind}: {e}") from None
                if self.stopping.wait(min(30.0, 2.0**attempt)):  # USR2 during the back-off
                    raise Stopping() from None
            except BaseException:
                if sb is not None:
                    sb.close()
                raise
        raise AssertionError("unreachable")

    def commit(self, partial: bool = True) -> None:
        """Commit the pending groups, `batch_groups` to a batch, in the order
        they finished; a smaller remainder too when `partial` (rl.rollout.batches).
        Nothing after a USR2 flush: the task is about to be requeued."""
        if self._flushed:
            return
        batches, self.pending = due(self.pending, self.rc.batch_groups, partial)
        for results in batches:
            self._write_batch(results)

    def _write_batch(self, results: list[GroupResult]) -> None:
        samples = [s for r in results for s in to_samples(r)]
        seq = self._writer.next_seq()
        self._writer.write(seq, samples)
        self.committed |= {r.group for r in results}
        log.info("committed batch %d: %d groups", seq, len(results))
        mine = len(self.committed & set(self.my_groups()))
        if self._curves is not None:
            latest = self.store.weights.latest() or 0
            self._curves.batch(mine, seq, results, samples, self.stats, time.monotonic() - self.started, latest)
            self._curves.sandboxes(mine, self.pool.replaced, self.verifier.pool.replaced, self.verifier.lost)
        self.save(
            batches=seq + 1,
            groups_committed=mine,
            episodes_committed=mine * self.rc.group_size,
            episodes=self.stats.episodes,
            retries=self.stats.retries,
            generator_retries=self.stats.generator_retries,
            failures=dict(self.stats.failures),
            rate=round(self.stats.episodes / max(1e-9, time.monotonic() - self.started), 4),
        )

    # --------------------------------------------------------------- USR2
    def flush(self) -> None:
        """Called on USR2 from the signal handler (main thread): commit the
        complete groups, and let the in-flight episodes end unplayed. The
        loop runs on another thread (rl.rollout.loop), so the flush waits
        for it to leave its critical section and never commits half-changed
        groups. Where the loop runs on the signal's own thread (a worker
        driven directly), a signal that lands inside that section commits
        nothing: those groups are played again after the requeue, never
        lost or doubled."""
        self.stopping.set()
        if self._writer is None:
            return
        if self._loop_thread == threading.get_ident():
            if not self._lock.acquire(blocking=False):
                return
        elif not self._lock.acquire(timeout=120):
            log.warning("USR2: the loop held its lock for 120 s; its complete groups are played again")
            return
        try:
            self.commit()
            self._flushed = True
        finally:
            self._lock.release()
        self.ex.shutdown(wait=False, cancel_futures=True)

    def summary(self) -> dict[str, Any]:
        s = self.stats
        return {
            "worker": self.index,
            "episodes": s.episodes,
            "retries": s.retries,
            "generator_retries": s.generator_retries,
            "dropped_groups": s.dropped_groups,
            "failures": dict(s.failures),
            "abandoned": len(self.abandoned),
        }
