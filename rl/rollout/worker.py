"""One rollout worker: the groups it plays, the episodes it runs, the
batches it commits (the outline is rl.rollout.loop).

`Worker.run` plays the worker's share of the groups (and any share handed
to it), `concurrency` episodes at a time on a thread pool; `Worker.loop`
starts groups as the gate allows, collects finished episodes into groups,
and commits complete groups in batches; `Worker.flush` commits the complete
groups on USR2.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from rl.context import RunContext
from rl.episodes.episode import Episode, run_episode
from rl.episodes.samples import GroupResult, failure_of, to_samples
from rl.fsio import read_json
from rl.rollout.config import RolloutRole
from rl.rollout.curves import RolloutCurves
from rl.rollout.group_request import GroupReplies
from rl.rollout.harness import EndpointFailed, run_harness
from rl.rollout.queue import TaskQueue
from rl.store import Store
from rl.tasks.format import Task
from rl.tasks.quarantine import quarantine

log = logging.getLogger("sarl.rollout")


class Abandon(Exception):
    """The group cannot be committed; the message is the recorded reason."""


class InfraFailure(Abandon):
    """Infrastructure failures outlasted the retries: never a policy failure."""


class Stopping(Exception):
    """The worker is stopping (USR2): in-flight episodes end unplayed."""


@dataclass
class Stats:
    """Counts since this start; updated from episode threads."""

    episodes: int = 0
    retries: int = 0
    """Episodes played again after an infrastructure failure."""
    generator_retries: int = 0
    """Requests that a second generator served after one failed."""
    dropped_groups: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    generator_wait_s: float = 0.0
    gate_wait_s: float = 0.0
    """Seconds with nothing to start: the staleness bound or the round's version."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, **delta: float) -> None:
        with self.lock:
            for k, v in delta.items():
                setattr(self, k, getattr(self, k) + v)

    def failed(self, why: str) -> None:
        with self.lock:
            self.failures[why or "passed"] = self.failures.get(why or "passed", 0) + 1


def committed_groups(store: Store) -> set[int]:
    """The groups that any committed batch holds, from episode identities."""
    reader = store.reader()
    out: set[int] = set()
    for key in reader.committed():
        out |= {int(e.split("/")[0]) for e in reader.info(key).episode_ids if e}
    return out


def episode_seed(seed: int, group: int, i: int) -> int:
    """A sampling seed stable across processes (`hash()` of a tuple is not)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{group}/{i}".encode()).digest()[:4], "little") & 0x7FFFFFFF


SHARES_POLL_S = 2.0
"""How often a playing worker looks for a share handed to it (a few small files)."""

GATE_POLL_S = 0.25
"""How often a held gate looks for a new version (a cheap listing of the store)."""


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
        return sorted(g for k in self.shares for g in range(k, self.rc.groups, self.rc.tasks))

    def _take_up(self) -> list[int]:
        """Shares handed to this worker since it last looked (rl.rollout.shares):
        their groups to play, with the tasks their first worker planned."""
        from rl.rollout import shares

        self._shares_read = time.monotonic()
        rd = self.ctx.layout
        now = shares.shares_of(rd, self.index, self.rc.tasks)
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
        return [g for k in new for g in range(k, self.rc.groups, self.rc.tasks) if g not in gone]

    # ------------------------------------------------------------- the loop
    def run(self) -> dict[str, Any]:
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
        self.shares = []
        todo = sorted(self._take_up())
        done = len(self.my_groups()) - len(todo)
        log.info("worker %d: shares %s, %d groups to play, %d done", self.index, self.shares, len(todo), done)
        self.started = time.monotonic()
        self.gateway = self._gateway() if self.rc.agent.harness is not None else None
        sandbox = self.ctx.sandbox
        if self.gateway is not None:  # a harness program reaches its endpoint, and nothing else
            sandbox = sandbox.model_copy(update={"network": [*sandbox.network, f"127.0.0.1:{self.gateway.port}"]})
        with (
            self.gateway if self.gateway is not None else contextlib.nullcontext(),
            WarmPool(sandbox, size=min(self.rc.concurrency, 4)) as self.pool,
            Verifier(self.ctx.verify, sandbox=self.ctx.sandbox) as self.verifier,
            ThreadPoolExecutor(self.rc.concurrency) as self.ex,
        ):
            t0 = time.monotonic()
            self.loop(todo)
            while not self.stopping.is_set() and (more := self._take_up()):  # handed over while I ended
                self.loop(more)
            self.loop_s = time.monotonic() - t0
            """Seconds of the loop alone: from the first group started to the last batch committed."""
        self._curves.close()
        if not self.stopping.is_set():
            from rl.rollout import shares

            shares.finish(self.ctx.layout, self.index, self.shares)
        return self.summary()

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

    def loop(self, todo: list[int]) -> None:
        inflight = self.inflight
        self._loop_thread = threading.get_ident()
        while (todo or inflight) and not self.stopping.is_set():
            if time.monotonic() - self._shares_read > SHARES_POLL_S:
                todo[:] = sorted(todo + self._take_up())
            with self._critical():
                blocked = self._start(todo)
                if not inflight and self.pending:
                    self._commit()
            if not inflight:
                self.progressed()  # nothing running: waiting on the learner's gate, not stalled
                if todo:
                    self.stats.count(gate_wait_s=GATE_POLL_S)
                    time.sleep(GATE_POLL_S)  # the gate: waiting for the learner
                continue
            if time.monotonic() - self._beat_at > 2.0:
                self.beat(inflight=len(inflight), pending=len(self.pending))
                self._beat_at = time.monotonic()
            # a held gate is looked at again soon: a version published while episodes
            # run lets the next groups start at once, not when one of them ends
            finished, _ = wait(list(inflight), timeout=GATE_POLL_S if blocked else 5.0, return_when=FIRST_COMPLETED)
            if finished:  # an episode ended (played, retried out, or stopped): the loop advances
                self.progressed()
            with self._critical():
                for f in finished:
                    self._finish(f)
                nothing_more = (blocked or not todo) and not inflight
                if len(self.pending) >= self.rc.batch_groups or (self.pending and nothing_more):
                    self._commit(partial=nothing_more)
        with self._critical():
            if self.pending and not self.stopping.is_set():
                self._commit()

    @contextlib.contextmanager
    def _critical(self) -> Iterator[None]:
        """The loop changes the groups or commits: a USR2 flush waits for it to finish."""
        with self._lock:
            yield

    def _start(self, todo: list[int]) -> bool:
        """Start groups while there is room; True when the gate holds the next one back."""
        inflight, groups = self.inflight, self.groups
        while todo and len(inflight) < self.rc.concurrency and not self.stopping.is_set():
            g = todo[0]
            gate = self._gate(g)
            if gate == "wait":
                return True
            todo.pop(0)
            task = self._task_of(g) if gate == "start" else None
            if task is None:
                continue  # abandoned, with its reason
            groups[g] = [None] * self.rc.group_size
            together = self.rc.group_request and self.rc.agent.harness is None  # a program asks by itself
            first = GroupReplies(self.rc.group_size, episode_seed(self.ctx.seed, g, -1)) if together else None
            for i in range(self.rc.group_size):
                inflight[self.ex.submit(self._episode, task, g, i, first)] = (g, i)
        return False

    def _finish(self, f: Future[Episode]) -> None:
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
        """`start`, `wait`, or `closed` (sync: the group's round has passed).

        Async: groups up to `max_staleness` steps ahead of the published
        version may start, and one more for each group given up anywhere in
        the run (rl.store.given_up), so that dropped groups never leave the
        learner short of a step while the gate waits for that step. Sync: a
        round's groups start with its version; a round the learner closed
        (every group committed or given up) is not played."""
        gps = self.rc.groups_per_step
        if not gps:
            return "start"
        v = self.store.weights.latest() or 0
        if self.ctx.sync:
            r = group // gps
            if v > r:
                self._abandon(group, f"sync: round {r} closed, version {v} is published")
                return "closed"
            return "start" if v == r else "wait"
        if group < (self.ctx.max_staleness + v + 1) * gps:
            return "start"
        return "start" if group < (self.ctx.max_staleness + v + 1) * gps + self.store.given_up.count() else "wait"

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

    def _generate(
        self, group: int, i: int, first: GroupReplies | None
    ) -> tuple[Callable[[list[int], Any], tuple[Any, int]], Callable[[], float]]:
        """The policy, for episode i of `group`: through the generator client;
        in sync mode only the round's version may answer; its first reply
        from the group's request (`first`) when there is one. With it, the
        seconds the episode has waited for a generator so far (run_episode's
        `waited`)."""
        need = group // self.rc.groups_per_step if self.ctx.sync else None
        waited = [0.0]
        asked = [0]

        def ask(prompt: list[int], params: Any) -> tuple[list[Any], int, float]:
            w = 0.0  # seconds waited for a generator, not generating
            while True:
                if self.stopping.is_set():
                    raise Stopping()
                # NoGenerator ends this attempt; the next one starts with its own deadline
                r = self.client.generate([prompt], params)
                w += r.waited_s
                self.stats.count(generator_wait_s=r.waited_s, generator_retries=r.attempts - 1)
                if need is None or r.version == need:
                    return r.outputs[0], r.version, w
                if r.version > need:
                    raise Abandon(f"sync: round {need} closed, a generator serves version {r.version}")
                self.stopping.wait(0.5)  # the generator has not loaded the round's version yet
                w += 0.5

        def generate(prompt: list[int], params: Any) -> tuple[Any, int]:
            asked[0] += 1
            if first is not None and asked[0] == 1:
                completion, version, w = first.reply(i, prompt, params, ask)
            else:
                completions, version, w = ask(prompt, params)
                completion = completions[0]
            waited[0] += w
            return completion, version

        return generate, lambda: waited[0]

    def _episode(self, task: Task, group: int, i: int, first: GroupReplies | None = None) -> Episode:
        from rl.agent.env import EnvironmentFailed
        from rl.serving.client import NoGenerator
        from sandboxes import SandboxError

        max_len = self.rc.max_model_len
        assert max_len is not None  # checked at construction
        for attempt in range(self.rc.max_retries + 1):
            generate, waited = self._generate(group, i, first)
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

    def _commit(self, partial: bool = True) -> None:
        """Commit the pending groups, `batch_groups` to a batch, in the order
        they finished; a smaller remainder too when `partial`, else it waits
        for more. (One batch of every group that finished together would
        let a learner step, which takes whole batches, eat the groups meant
        for the next version.) Nothing after a USR2 flush: the task is
        about to be requeued."""
        size = self.rc.batch_groups
        while not self._flushed and (len(self.pending) >= size or (partial and self.pending)):
            results, self.pending = self.pending[:size], self.pending[size:]
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
            self._commit()
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
