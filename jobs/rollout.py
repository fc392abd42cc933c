"""The `rollout` role: one worker of the rollout array (rl.rollout.worker).

Its state records the task planned for each group and the groups it
abandoned (with their reasons); which groups are committed is read from the
store when it starts, so a worker killed at any instant starts over with
exactly the groups that no batch holds, each with its planned task. On USR2
it commits the groups it has complete, then requeues.

TensorBoard (`RUN/tb/rollout-NNNNNN/`, step: episodes committed):
rl.rollout.curves. `sarl status` shows episodes committed and in flight,
failures by reason, abandoned groups, retries and the episode rate.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rl.config import Config, RoleConfig, RolloutRole
from rl.run.role import Role


class Rollout(Role):
    name = "rollout"

    def __init__(self, run_dir: str):
        super().__init__(run_dir)
        self.worker: Any = None
        self._loop: threading.Thread | None = None
        self.inflight = 0

    def initial_state(self, role_cfg: RoleConfig) -> dict[str, Any]:
        return {**super().initial_state(role_cfg), "planned": {}, "abandoned": {}}

    def progress(self) -> str:
        s = self.state
        if "planned" not in s:
            return ""
        fails = ", ".join(f"{k} {v}" for k, v in sorted(s.get("failures", {}).items()))
        return (
            f"{s.get('episodes_committed', 0)} episodes committed in {s.get('batches', 0)} batches, "
            f"{self.inflight} in flight, {s.get('rate', 0.0):.2f}/s; failures: {fails or 'none'}; "
            f"{len(s.get('abandoned', {}))} groups abandoned, {s.get('retries', 0)} retries"
        )

    def run(self, cfg: Config, role_cfg: RoleConfig) -> dict[str, Any]:
        assert isinstance(role_cfg, RolloutRole)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from rl.rollout.worker import Worker

        def alive(**info: int) -> None:
            self.inflight = info.get("inflight", 0)
            self.beat(**info)

        self.worker = Worker(
            self.run_dir, cfg, role_cfg, self.task, self.state, save=self.commit, beat=alive, progressed=self.progressed
        )
        # The loop runs on its own thread, so that a USR2 handler (always on
        # the main thread) can wait for a batch being written instead of
        # landing inside it.
        outcome: dict[str, Any] = {}

        def play() -> None:
            try:
                outcome["result"] = self.worker.run()
            except BaseException as e:  # re-raised on the main thread below
                outcome["error"] = e

        self._loop = threading.Thread(target=play, name="rollout-loop", daemon=True)
        self._loop.start()
        while self._loop.is_alive():
            self._loop.join(1.0)  # a timed join lets the signal handlers run
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def on_usr2(self) -> None:
        """USR2: commit the complete groups first, then save and requeue
        (after the loop has closed its sandboxes, or 30 s)."""
        if self.worker is not None:
            self.worker.flush()
            if self._loop is not None:
                self._loop.join(30.0)
