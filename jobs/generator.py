"""The `generator` role: one task of the generator array.

Each task builds its engine on the base checkpoint, loads the newest weight
version in the store if there is one, and serves over HTTP. Every `poll_s`
it announces itself in `endpoints/generator-NNNNNN.json` (address, port,
loaded version, queue; from a thread of its own, so that a swap does not
silence it) and looks for a newer version, which it loads into the live
engine between batches. Restarted (requeue, resume), it starts over
from the newest version: a generator has no state to lose. In a run with a
learner it ends, done, once the learner and every rollout worker are done.

TensorBoard (`RUN/tb/generator-NNNNNN/`, step: seconds since the run
started, so that a restarted task's curves go on forward): the loaded
version, queued requests, prompts served, tokens per second of wall time
and of engine time, the engine's busy seconds, its seconds spent loading
weight versions, its idle ratio (the share of each poll's time it neither
generated nor loaded weights: it waited on the rollouts or the learner),
and how long each swap held requests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

from rl.config import Config, GeneratorRole, RoleConfig
from rl.generator.endpoint import Announcer, Endpoint, run_secret
from rl.run.role import Role, current_job_id
from rl.run.rundir import RunDir
from rl.store import StoreError

log = logging.getLogger("sarl.generator")


def _training_over(rd: RunDir, cfg: Config) -> bool:
    """In a run with a learner, the generators' work ends with the learner's
    and every rollout worker's; a run of generators alone serves on (until
    `serve_s`). The rollout count is read afresh: `sarl scale` changes it."""
    if cfg.learner is None or not rd.all_done("learner"):
        return False
    return cfg.rollout is None or rd.all_done("rollout")


def host_address() -> str:
    """An address other nodes can reach this host at."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _curves(
    tb: Any, health: dict[str, Any], version: int, last: tuple[float, int, float, float], run_started: float
) -> Any:
    """Draw this poll's points; returns what the next poll measures from."""
    now = time.monotonic()
    step = int(time.time() - run_started)
    tb.add_scalar("generator/version", version, step)
    tb.add_scalar("generator/queued", health["queued"], step)
    tb.add_scalar("generator/prompts_served", health["served"], step)
    tokens = health["tokens"] - last[1]
    if now > last[0]:
        tb.add_scalar("generator/tokens_per_s", tokens / (now - last[0]), step)
    busy = health["generate_s"] - last[2]
    if busy > 0:
        tb.add_scalar("generator/engine_tokens_per_s", tokens / busy, step)
    swap = health["swap_s"] - last[3]
    if now > last[0]:  # the share of this poll's time the engine neither generated nor loaded weights
        tb.add_scalar("generator/idle_ratio", max(0.0, 1.0 - (busy + swap) / (now - last[0])), step)
    tb.add_scalar("generator/busy_s", health["generate_s"], step)
    tb.add_scalar("generator/swap_s", health["swap_s"], step)
    tb.flush()
    return now, health["tokens"], health["generate_s"], health["swap_s"]


def _writer(folder: Any) -> Any:
    """A TensorBoard writer, or None (with a warning) where tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.warning("tensorboard is not installed: no curves for this generator")
        return None
    return SummaryWriter(str(folder))


@contextlib.contextmanager
def pinned(weights: Any, holder: str, version: int) -> Iterator[None]:
    """Keep `version` from retention while it is being loaded."""
    weights.pin(holder, version)
    try:
        yield
    finally:
        weights.unpin(holder)


class Generator(Role):
    name = "generator"

    def progress(self) -> str:
        v = self.state.get("version")
        if v is None:
            return ""
        where = f" on {self.state['addr']}:{self.state['port']}" if "port" in self.state else ""
        return f"serving version {v}{where}, {self.state.get('served', 0)} prompts served"

    def run(self, cfg: Config, role_cfg: RoleConfig) -> dict[str, Any]:
        assert isinstance(role_cfg, GeneratorRole)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from rl.engine import make_engine
        from rl.generator.service import GeneratorServer
        from rl.store.weights import WeightStore

        rd = RunDir(self.run_dir)
        store = str(rd.path / "store.zarr")
        weights = WeightStore(store)
        t0 = time.monotonic()
        engine = make_engine(role_cfg.engine, cfg.model, seed=cfg.run.seed + self.task)
        log.info("%s engine ready in %.1f s", engine.backend, time.monotonic() - t0)
        holder = f"generator-{self.task}"
        refused: set[int] = set()
        loaded = None  # None: the base checkpoint, served as version 0
        for version in reversed(weights.versions()):  # the newest that loads
            try:
                with pinned(weights, holder, version):
                    engine.load_version(store, version)
            except StoreError as e:  # raised before any weight changed: try the one before
                log.error("weight version %d refused: %s", version, e)
                refused.add(version)
                self.commit(refused={**self.state.get("refused", {}), str(version): str(e)})
                continue
            loaded = version
            break
        port = role_cfg.port + self.task if role_cfg.port else 0
        server = GeneratorServer(
            engine, role_cfg.bind, port, role_cfg.max_queue, role_cfg.max_batch, token=run_secret(rd.path)
        ).start()
        addr = host_address() if role_cfg.bind in ("0.0.0.0", "") else role_cfg.bind
        log.info("serving on %s:%d", addr, server.port)
        self.commit(version=engine.version, served=0, port=server.port, addr=addr)
        started = time.monotonic()
        tb = _writer(rd.path / "tb" / f"generator-{self.task:06d}")
        last = (started, 0, 0.0, 0.0)
        tokens_seen = 0
        run_started = rd.started_at
        me: dict[str, Any] = {"task": self.task, "addr": addr, "host": socket.gethostname(), "port": server.port}
        me.update(pid=os.getpid(), job_id=current_job_id(), every_s=role_cfg.poll_s)
        announcer = Announcer(
            rd.path, self.task, role_cfg.poll_s, lambda: Endpoint(**me, at=time.time(), **server.health())
        )
        announcer.start()
        try:
            while role_cfg.serve_s is None or time.monotonic() - started < role_cfg.serve_s:
                health = server.health()
                if tb is not None:
                    last = _curves(tb, health, engine.version, last, run_started)
                self.state.update(served=health["served"])
                if health["tokens"] > tokens_seen or not (health["busy"] or health["queued"]):
                    self.progressed()  # it generated, or had nothing to do; an engine stuck on a batch does neither
                tokens_seen = health["tokens"]
                self.beat(version=engine.version, port=server.port)
                # read before the newest version: a learner is done only after its last publish,
                # so a generator that ends here has loaded that version first
                over = _training_over(rd, cfg)
                latest = weights.latest()
                if latest is not None and (loaded is None or latest > loaded) and latest not in refused:
                    try:
                        with pinned(weights, holder, latest):
                            held = server.swap(store, latest)
                    except StoreError as e:  # raised before any weight changed: serve on with the old ones
                        log.error("weight version %d refused, still serving %d: %s", latest, engine.version, e)
                        refused.add(latest)
                        self.commit(refused={**self.state.get("refused", {}), str(latest): str(e)})
                    else:
                        loaded = latest
                        log.info("loaded weight version %d (requests held %.2f s)", latest, held)
                        if tb is not None:
                            tb.add_scalar("generator/swap_held_s", held, int(time.time() - run_started))
                        swap = {"version": latest, "held_s": round(held, 3), "at": time.time()}
                        swaps = [*self.state.get("swaps", []), swap]
                        self.commit(version=latest, served=health["served"], swaps=swaps[-20:])
                if over:
                    log.info("the learner and every rollout worker are done: the generator ends")
                    break
                time.sleep(role_cfg.poll_s)
        finally:
            if tb is not None:
                tb.close()
            announcer.close()  # withdrawn before the server stops: no client sends to a closed port
            server.stop()
            engine.close()
        return {"task": self.task, "version": engine.version, "served": server.served}
