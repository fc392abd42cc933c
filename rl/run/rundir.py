"""The run directory as the run machinery sees it: the single source of
truth of a run (its layout: rl.layout).

The config is frozen in run.toml at the first submit; later submits and
`sarl resume --set` may change only mid-run-safe keys, each change logged
in config-history.jsonl. Submission records and the run's lock serialise
the commands that submit or cancel jobs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl.config import Config, ConfigError, dump_toml, load_config, to_plain, unsafe_changes, validate_config
from rl.fsio import atomic_write, commit_dir, read_json, write_json
from rl.layout import SUBDIRS, RunLayout


class RunDir(RunLayout):
    """A run directory as the run machinery sees it: its paths
    (rl.layout), frozen config, submissions and lock."""

    def all_done(self, role: str) -> bool:
        """Every task of `role` committed `done` (the count read afresh from
        run.toml: `sarl scale` changes it); False when the run has no such role."""
        rc = self.config().roles().get(role)
        if rc is None:
            return False
        return all((read_json(self.state_path(role, t)) or {}).get("done") for t in range(rc.workers))

    # --------------------------------------------------------------- config
    def config(self) -> Config:
        """The frozen config of the run."""
        if not self.exists():
            raise ConfigError(f"{self.path}: not a run directory (no run.toml)")
        return load_config(self.config_path, base_dir=self.path)

    def create(self, cfg: Config) -> None:
        """Create the run directory with its frozen config, all at once: it is
        built under a temporary name and renamed into place."""

        def build(tmp: Path) -> None:
            for sub in SUBDIRS:
                (tmp / sub).mkdir()
            RunLayout(tmp).config_path.write_text(dump_toml(cfg))
            RunLayout(tmp).created_at_path.write_text(f"{time.time():.3f}\n")

        if not commit_dir(self.path, build):
            raise FileExistsError(f"{self.path}: exists")  # another submit created it first

    def accept(self, new: Config, source: str) -> list[str]:
        """Check a config against the frozen one. Mid-run-safe changes are
        written into run.toml (and logged); any other change is refused."""
        old = self.config()
        safe, unsafe = unsafe_changes(old, new)
        if unsafe:
            raise ConfigError(
                f"{source}: differs from the frozen {self.config_path} in keys that cannot change mid-run: "
                + ", ".join(unsafe)
                + ". Start a new run (another run.name) or undo these changes."
            )
        if safe:
            atomic_write(self.config_path, dump_toml(new))
            with open(self.path / "config-history.jsonl", "a") as f:
                f.write(json.dumps({"at": time.time(), "changed": safe, "config": to_plain(new)}) + "\n")
        return safe

    def with_overrides(self, overrides: list[str], cluster: str | None) -> Config:
        """The frozen config with `--set` / `--cluster` applied and validated."""
        import tomllib

        from rl.config import _merge, parse_overrides

        raw = tomllib.loads(self.config_path.read_text())
        if overrides:
            raw = _merge(raw, parse_overrides(overrides))
        return validate_config(raw, f"{self.config_path} (with --set)", cluster=cluster, base_dir=self.path)

    # ----------------------------------------------------------- submissions
    @contextlib.contextmanager
    def lock(self, wait: bool = True) -> Iterator[bool]:
        """Serialise the commands that submit or cancel jobs of this run.
        Yields True when held; with `wait = False`, False at once when
        another process holds it (and nothing is held)."""
        with open(self.path / ".lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def submissions(self, role: str) -> list[dict[str, Any]]:
        """Submission records of a role, oldest first."""
        folder = self.submissions_path(role)
        if not folder.is_dir():
            return []
        out = []
        for p in sorted(folder.glob("[0-9]*.json")):
            rec = read_json(p)
            if rec is not None:
                rec["_path"] = str(p)
                out.append(rec)
        return out

    def add_submission(self, role: str, record: dict[str, Any]) -> Path:
        n = len(self.submissions(role))
        path = self.submissions_path(role) / f"{n:04d}.json"
        write_json(path, record)
        return path

    @property
    def cancelled_path(self) -> Path:
        """Written by `sarl cancel`, removed by `sarl resume` and `sarl submit`:
        while it exists, the run's own watchers start nothing (rl.run.recovery)."""
        return self.path / "cancelled.json"

    def mark_cancelled(self, record: dict[str, Any]) -> None:
        rec = {k: v for k, v in record.items() if k != "_path"}
        rec["cancelled_at"] = time.time()
        write_json(Path(record["_path"]), rec)
