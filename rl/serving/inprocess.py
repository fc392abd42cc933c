"""A generator service inside this process, announced as a generator job
announces itself: what `sarl eval` (its own engine) and `sarl bench rollout`
serve with, so that clients and workers reach it as they reach the role.
Announcements go to `folder`'s endpoints/ every 2 s; the secret is `folder`'s."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def serving(engine: Any, folder: Path) -> Iterator[Any]:
    """A started GeneratorServer on `engine`, announced in `folder` until the block ends."""
    from rl.serving.announcements import Endpoint, announce, run_secret
    from rl.serving.service import GeneratorServer

    server = GeneratorServer(engine, bind="127.0.0.1", token=run_secret(folder)).start()
    stop = threading.Event()

    def keep_announcing() -> None:  # what the generator role does every poll
        while not stop.is_set():
            h = server.health()
            ep = Endpoint(0, "127.0.0.1", server.port, h["version"], h["queued"], time.time(), backend=engine.backend)
            announce(folder, ep)
            stop.wait(2.0)

    thread = threading.Thread(target=keep_announcing, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        server.stop()
        thread.join(timeout=5)
