"""One rollout worker: an outline, and the code below it reads the same (the
parts are rl.rollout.worker; the gate rl.rollout.gate, the policy an
episode calls rl.rollout.generation, batches rl.rollout.batches).

    groups = my share of the run's groups (k, k + N, k + 2N, ...), and the
             share of any given-up worker handed to me (rl.rollout.shares),
             looked for while I play and once more before I end
    done   = the groups any committed batch holds (the store, not my state
             file, is the truth) + the groups I (or a given-up worker whose
             share I play) abandoned
    for each group not done, as the gate allows (async: the staleness
    bound; sync: its round's weight version is the newest):
        its task = the plan recorded for it, else drawn from the queue
                   (rl.rollout.queue) and recorded before it starts
        play group_size episodes, `concurrency` at a time, retrying
        infrastructure failures
    every `batch_groups` complete groups, or when nothing more can start
    for now: commit one batch
    on USR2 (preemption, time limit): commit the complete groups, then
    requeue (rl.run.role)

The loop runs on a thread of its own, so that a USR2 handler (always on
the main thread) can wait for a batch being written instead of landing
inside it.

Exactly once: episode `g/i` (group g, sample i) is committed in one batch or
its group is recorded as abandoned with its reason. A worker killed at any
instant loses only the groups it had in flight, and plays them again, with
the same task, when it starts over: they were never committed. The writer
id is the worker's (`rollout-NNNNNN`) and batch sequence numbers come from
the store, so a batch is never written twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rl.context import RunContext
from rl.rollout.config import RolloutRole

if TYPE_CHECKING:
    from rl.rollout.worker import Worker

log = logging.getLogger("sarl.rollout")


def run(ctx: RunContext, cfg: RolloutRole) -> dict[str, Any]:
    from rl.rollout.worker import Worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    worker = Worker(ctx, cfg)
    return _on_a_thread(ctx, lambda: play(worker), worker.flush)


def play(w: Worker) -> dict[str, Any]:
    """The worker's groups, played and committed; its summary."""
    with w.playing():  # the generator client, the writer, sandboxes, the verifier, episode threads
        todo = sorted(w.take_up())  # my share, and any handed to me, less the groups done
        done = len(w.my_groups()) - len(todo)
        log.info("worker %d: shares %s, %d groups to play, %d done", w.index, w.shares, len(todo), done)
        t0 = time.monotonic()
        _play_groups(w, todo)
        while not w.stopping.is_set() and (more := w.take_up()):  # handed over while I ended
            _play_groups(w, more)
        w.loop_s = time.monotonic() - t0  # the loop alone: first group started to last batch committed
    if not w.stopping.is_set():
        w.finish_shares()
    return w.summary()


def _play_groups(w: Worker, todo: list[int]) -> None:
    w.on_loop_thread()
    while (todo or w.inflight) and not w.stopping.is_set():
        if w.shares_due():
            todo[:] = sorted(todo + w.take_up())
        with w.critical():  # a USR2 flush waits while the groups change
            gate_held = w.start_groups(todo)  # as the gate allows, `concurrency` episodes at a time
            if not w.inflight and w.pending:
                w.commit()
        if not w.inflight:
            w.progressed()  # nothing running: waiting on the learner's gate, not stalled
            if todo:
                w.wait_at_gate()
            continue
        finished = w.wait_for_episodes(gate_held)
        with w.critical():
            for f in finished:
                w.finish(f)  # into its group; a complete group waits for a batch
            nothing_more = (gate_held or not todo) and not w.inflight
            if len(w.pending) >= w.rc.batch_groups or (w.pending and nothing_more):
                w.commit(partial=nothing_more)
    with w.critical():
        if w.pending and not w.stopping.is_set():
            w.commit()


def _on_a_thread(ctx: RunContext, body: Callable[[], dict[str, Any]], flush: Callable[[], None]) -> dict[str, Any]:
    """`body` on a thread of its own; on USR2 the main thread commits the
    complete groups first (`flush`), then lets the task be saved and
    requeued once the loop has closed its sandboxes (or after 30 s)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = body()
        except BaseException as e:  # re-raised on the main thread below
            outcome["error"] = e

    loop = threading.Thread(target=target, name="rollout-loop", daemon=True)

    def on_usr2() -> None:
        flush()
        loop.join(30.0)

    ctx.on_usr2(on_usr2)
    loop.start()
    while loop.is_alive():
        loop.join(1.0)  # a timed join lets the signal handlers run
    if "error" in outcome:
        raise outcome["error"]
    result: dict[str, Any] = outcome["result"]
    return result


def progress(state: dict[str, Any], inflight: int) -> str:
    """A worker's line in `sarl status`: episodes committed and in flight,
    failures by reason, abandoned groups, retries and the episode rate."""
    if "planned" not in state:
        return ""
    fails = ", ".join(f"{k} {v}" for k, v in sorted(state.get("failures", {}).items()))
    return (
        f"{state.get('episodes_committed', 0)} episodes committed in {state.get('batches', 0)} batches, "
        f"{inflight} in flight, {state.get('rate', 0.0):.2f}/s; failures: {fails or 'none'}; "
        f"{len(state.get('abandoned', {}))} groups abandoned, {state.get('retries', 0)} retries"
    )
