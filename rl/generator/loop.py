"""The generator: an outline.

    build the engine on the base checkpoint; load the newest weight version
        that loads (rl.generator.versions)
    serve over HTTP (rl.serving.service), announced in
        endpoints/generator-NNNNNN.json from a thread of its own
        (rl.serving.announcements: a swap does not silence it)
    every `poll_s`:
        draw the curves (rl.generator.curves), beat
        a newer version published: swap it into the live engine between batches
        the learner and every rollout worker done: end
    on the way out: withdraw the announcement, then stop serving

Restarted (requeue, resume), it starts over from the newest version: a
generator has no state to lose. In a run with a learner it ends, done,
once the learner and every rollout worker are done; a run of generators
alone serves on (until `serve_s`, or cancelled).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from rl.context import RunContext
from rl.generator.config import GeneratorRole

log = logging.getLogger("sarl.generator")


def run(ctx: RunContext, cfg: GeneratorRole) -> dict[str, Any]:
    from rl.engine import make_engine
    from rl.generator.curves import GeneratorCurves
    from rl.generator.versions import Versions
    from rl.serving.announcements import run_secret
    from rl.serving.service import GeneratorServer
    from rl.store.weights import WeightStore

    t0 = time.monotonic()
    engine = make_engine(cfg.engine, ctx.model, seed=ctx.seed + ctx.task)
    log.info("%s engine ready in %.1f s", engine.backend, time.monotonic() - t0)
    versions = Versions(ctx, WeightStore(ctx.layout.store_path))
    versions.load_newest(engine)
    port = cfg.port + ctx.task if cfg.port else 0
    server = GeneratorServer(engine, cfg.bind, port, cfg.max_queue, cfg.max_batch, token=run_secret(ctx.run_dir))
    server.start()
    addr = host_address() if cfg.bind in ("0.0.0.0", "") else cfg.bind
    log.info("serving on %s:%d", addr, server.port)
    ctx.save(version=engine.version, served=0, port=server.port, addr=addr)
    announcer = _announcer(ctx, cfg, server, addr)
    curves = GeneratorCurves(ctx.layout.tb(f"generator-{ctx.task:06d}"), ctx.layout.started_at)
    started, tokens_seen = time.monotonic(), 0
    try:
        while cfg.serve_s is None or time.monotonic() - started < cfg.serve_s:
            health = server.health()
            curves.poll(health, engine.version)
            if health["tokens"] > tokens_seen or not (health["busy"] or health["queued"]):
                ctx.progressed()  # it generated, or had nothing to do; an engine stuck on a batch does neither
            tokens_seen = health["tokens"]
            ctx.beat(version=engine.version, port=server.port, served=health["served"])
            # read before the newest version: a learner is done only after its last publish,
            # so a generator that ends here has loaded that version first
            over = training_over(ctx)
            held = versions.swap_newer(server, health["served"])
            if held is not None:
                curves.swapped(held)
            if over:
                log.info("the learner and every rollout worker are done: the generator ends")
                break
            time.sleep(cfg.poll_s)
    finally:
        curves.close()
        announcer.close()  # withdrawn before the server stops: no client sends to a closed port
        server.stop()
        engine.close()
    return {"task": ctx.task, "version": engine.version, "served": server.served}


def training_over(ctx: RunContext) -> bool:
    """In a run with a learner, the generators' work ends with the learner's
    and every rollout worker's; a run of generators alone serves on."""
    if "learner" not in ctx.roles or not ctx.done("learner"):
        return False
    return "rollout" not in ctx.roles or ctx.done("rollout")


def host_address() -> str:
    """An address other nodes can reach this host at."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _announcer(ctx: RunContext, cfg: GeneratorRole, server: Any, addr: str) -> Any:
    """Announce this generator every `poll_s` from a thread of its own."""
    from rl.serving.announcements import Announcer, Endpoint

    me: dict[str, Any] = {"task": ctx.task, "addr": addr, "host": socket.gethostname(), "port": server.port}
    me.update(pid=os.getpid(), job_id=ctx.job_id, every_s=cfg.poll_s)
    announcer = Announcer(ctx.run_dir, ctx.task, cfg.poll_s, lambda: Endpoint(**me, at=time.time(), **server.health()))
    announcer.start()
    return announcer
