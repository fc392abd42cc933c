"""The endpoint record: how a generator announces itself to its clients.

Each generator task rewrites `RUN/endpoints/generator-NNNNNN.json` every
`poll_s` seconds (and removes it when it stops serving). Clients treat an
announcement older than their `stale_s` as a generator that is gone. This
module is the only place that writes or reads these files.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rl.fsio import CorruptFile, read_json, write_json

ENDPOINTS = "endpoints"


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
    swapping: bool = False
    """True while it loads a new weight version (requests are held)."""

    @property
    def key(self) -> str:
        return f"{self.addr}:{self.port}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Endpoint:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def endpoint_path(run_dir: str | os.PathLike[str], task: int) -> Path:
    return Path(run_dir) / ENDPOINTS / f"generator-{task:06d}.json"


def announce(run_dir: str | os.PathLike[str], endpoint: Endpoint) -> None:
    write_json(endpoint_path(run_dir, endpoint.task), asdict(endpoint))


def withdraw(run_dir: str | os.PathLike[str], task: int) -> None:
    endpoint_path(run_dir, task).unlink(missing_ok=True)


def read_endpoints(run_dir: str | os.PathLike[str], stale_s: float, now: float) -> list[Endpoint]:
    """Generators whose announcement is at most `stale_s` old at `now`."""
    folder = Path(run_dir) / ENDPOINTS
    out = []
    for f in sorted(folder.glob("generator-*.json")) if folder.is_dir() else []:
        try:
            ep = Endpoint.from_json(read_json(f) or {})
        except (OSError, CorruptFile, TypeError):
            continue  # removed or torn while we read it, or not a generator's
        if now - ep.at <= stale_s:
            out.append(ep)
    return out
