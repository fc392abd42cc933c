"""Where everything lives in a run directory (standard library only).

    runs/NAME/
      run.toml          resolved config, frozen at the first submit
      created_at        when the run directory was made
      config-history.jsonl  mid-run-safe changes accepted since, one line each
      store.zarr/       the exchange between roles (rl.store)
      checkpoints/      role state: ROLE/task-NNNNNN.json, learner checkpoints
      heartbeats/       ROLE/task-NNNNNN.json: last sign of life of each task
      submissions/      ROLE/NNNN.json: one record per submitted job or array
      recovery/         ROLE/: deaths of tasks, and what recovery handed over
      endpoints/        generator heartbeats (host, port, version)
      tb/               TensorBoard event files, one folder per role
      logs/             submitit folders, ROLE/ per role

`RunLayout` names the paths and reads nothing but files, so that the roles'
own code can find a file of the run without the config schema. The run
machinery's `rl.run.rundir.RunDir` adds the frozen config, submissions and
the run's lock. Every file is committed through rl.fsio: a reader sees the
old content or the new one, never a torn write.
"""

from __future__ import annotations

import os
from pathlib import Path

SUBDIRS = ("store.zarr", "checkpoints", "heartbeats", "submissions", "endpoints", "tb", "logs")


class RunLayout:
    """The paths of one run directory."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).resolve()

    @property
    def config_path(self) -> Path:
        return self.path / "run.toml"

    @property
    def store_path(self) -> Path:
        return self.path / "store.zarr"

    @property
    def created_at_path(self) -> Path:
        return self.path / "created_at"

    @property
    def secret_path(self) -> Path:
        """The run's shared secret, mode 0600. Every request to a generator
        carries it (`Authorization: Bearer ...`); a generator answers 401
        without it. Whoever can read the run directory's secret can use the
        run's generators: on a shared filesystem, keep the run directory your own."""
        return self.path / "secret"

    @property
    def endpoints_path(self) -> Path:
        """Where generators announce themselves (one record each)."""
        return self.path / "endpoints"

    def logs(self, role: str) -> Path:
        return self.path / "logs" / role

    def checkpoints(self, role: str) -> Path:
        """`role`'s checkpoints (`step-*`) and its tasks' states."""
        return self.path / "checkpoints" / role

    def submissions_path(self, role: str) -> Path:
        return self.path / "submissions" / role

    def state_path(self, role: str, task: int) -> Path:
        return self.checkpoints(role) / f"task-{task:06d}.json"

    def heartbeat_path(self, role: str, task: int) -> Path:
        return self.path / "heartbeats" / role / f"task-{task:06d}.json"

    def recovery(self, role: str) -> Path:
        """Recovery's records of `role`: deaths per task, hand-overs."""
        return self.path / "recovery" / role

    @property
    def curves_path(self) -> Path:
        """The run's TensorBoard folders, one per role task."""
        return self.path / "tb"

    def tb(self, folder: str) -> Path:
        """A TensorBoard folder of the run (`learner`, `rollout-000003`, ...)."""
        return self.curves_path / folder

    @property
    def started_at(self) -> float:
        """When the run directory was created (seconds since the epoch): the
        origin of the curves whose step is a time, so that a restarted task
        goes on from where its predecessor stopped."""
        try:
            return float(self.created_at_path.read_text())
        except (OSError, ValueError):  # a run directory from before the file existed
            return self.config_path.stat().st_mtime

    def exists(self) -> bool:
        return self.config_path.is_file()
