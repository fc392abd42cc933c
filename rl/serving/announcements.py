"""The endpoint record: how a generator announces itself to its clients.

Each generator task rewrites `RUN/endpoints/generator-NNNNNN.json` every
`poll_s` seconds from a thread of its own (`Announcer`: a weight swap or a
long turn of its main loop does not silence it), and removes it when it
stops serving. Clients treat an announcement older than their `stale_s` as
a generator that is gone, and one silent for longer than a few of its
intervals as a stopped process: they stop waiting for its answers
(rl.serving.client). This module is the only place that writes or reads
these files.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rl.fsio import CorruptFile, read_json, write_json
from rl.layout import RunLayout

log = logging.getLogger("sarl.generator")


@dataclass(frozen=True)
class Endpoint:
    """One generator's announcement."""

    task: int
    """Array task of the generator."""
    addr: str
    """Address clients connect to."""
    port: int
    """TCP port of its HTTP service."""
    version: int
    """Weight version it serves."""
    queued: int
    """Requests waiting in its queue when it announced."""
    at: float
    """Wall-clock time of the announcement (seconds since the epoch)."""
    host: str = ""
    """Host name of its node."""
    pid: int = 0
    """Process id of the serving process, on `host`."""
    job_id: str = ""
    """Scheduler id of its task."""
    backend: str = ""
    """Inference engine: `vllm` or `hf`."""
    busy: bool = False
    """True when its engine had work as it announced."""
    served: int = 0
    """Prompts answered since it started."""
    tokens: int = 0
    """Tokens generated since it started."""
    generate_s: float = 0.0
    """Seconds its engine spent generating since it started."""
    swap_s: float = 0.0
    """Seconds it spent loading weight versions since it started."""
    swapping: bool = False
    """True while it loads a new weight version (requests are held)."""
    every_s: float = 0.0
    """Seconds between two announcements (0: not said)."""

    @property
    def key(self) -> str:
        return f"{self.addr}:{self.port}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Endpoint:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def endpoint_path(run_dir: str | os.PathLike[str], task: int) -> Path:
    return RunLayout(run_dir).endpoints_path / f"generator-{task:06d}.json"


def announce(run_dir: str | os.PathLike[str], endpoint: Endpoint) -> None:
    write_json(endpoint_path(run_dir, endpoint.task), asdict(endpoint))


def withdraw(run_dir: str | os.PathLike[str], task: int) -> None:
    endpoint_path(run_dir, task).unlink(missing_ok=True)


def read_endpoint(run_dir: str | os.PathLike[str], task: int) -> Endpoint | None:
    """Generator `task`'s announcement, None when there is none (withdrawn, torn)."""
    try:
        return Endpoint.from_json(read_json(endpoint_path(run_dir, task)) or {})
    except (OSError, CorruptFile, TypeError):
        return None


class Announcer(threading.Thread):
    """Announces `make()` (an Endpoint, its `at` now) every `every_s`, from a
    thread of its own, until `close()`, which withdraws the announcement."""

    def __init__(self, run_dir: str | os.PathLike[str], task: int, every_s: float, make: Callable[[], Endpoint]):
        super().__init__(name="sarl-announce", daemon=True)
        self.run_dir, self.task, self.every_s, self.make = run_dir, task, every_s, make
        self.stop = threading.Event()

    def run(self) -> None:
        while True:
            try:
                announce(self.run_dir, self.make())
            except Exception:  # a full disk, a torn read of health: the next one tries again
                log.exception("announcement failed")
            if self.stop.wait(self.every_s):
                return

    def close(self) -> None:
        self.stop.set()
        if self.is_alive():
            self.join(timeout=10)
        withdraw(self.run_dir, self.task)


def read_endpoints(run_dir: str | os.PathLike[str], stale_s: float, now: float) -> list[Endpoint]:
    """Generators whose announcement is at most `stale_s` old at `now`."""
    folder = RunLayout(run_dir).endpoints_path
    out = []
    for f in sorted(folder.glob("generator-*.json")) if folder.is_dir() else []:
        try:
            ep = Endpoint.from_json(read_json(f) or {})
        except (OSError, CorruptFile, TypeError):
            continue  # removed or torn while we read it, or not a generator's
        if now - ep.at <= stale_s:
            out.append(ep)
    return out


def run_secret(run_dir: str | os.PathLike[str]) -> str:
    """The run's secret, created (readable by its owner only) if it is missing.
    Concurrent callers all get the same one: it is written whole under a
    temporary name and linked into place, so nobody reads half of it."""
    import secrets

    path = RunLayout(run_dir).secret_path
    for _ in range(2):
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            token = ""
        if token:
            return token
        tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another caller linked first: read theirs
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    raise OSError(f"{path}: exists but is empty")
