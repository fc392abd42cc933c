"""One rollout worker: an outline (the parts are rl.rollout.worker).

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
from typing import Any

from rl.context import RunContext
from rl.rollout.config import RolloutRole


def run(ctx: RunContext, cfg: RolloutRole) -> dict[str, Any]:
    from rl.rollout.worker import Worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    worker = Worker(ctx, cfg)
    outcome: dict[str, Any] = {}

    def play() -> None:
        try:
            outcome["result"] = worker.run()
        except BaseException as e:  # re-raised on the main thread below
            outcome["error"] = e

    loop = threading.Thread(target=play, name="rollout-loop", daemon=True)

    def on_usr2() -> None:
        """Commit the complete groups first, then let the task be saved and
        requeued once the loop has closed its sandboxes (or after 30 s)."""
        worker.flush()
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
