"""A warm pool: sandboxes created ahead of need, refilled in the background.

`take()` hands out a ready sandbox (or makes one if none is ready) whose
resident has just answered: one that died or hung while it waited in the pool
is closed, counted in `replaced`, and another is taken. `give()` takes it back
after an episode: it is reset (every process killed, /sandbox and /tmp
emptied) and returned to the pool, or closed if it died or the pool is full.
A background thread keeps `size` sandboxes ready; when a sandbox cannot be
made (no free slot, a backend that fails), it records why in `last_error`,
waits, and tries again: the thread never dies of it, and `take()` raises the backend's error to its caller instead.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any

from sandboxes import open_sandbox
from sandboxes.base import SandboxError
from sandboxes.config import SandboxConfig


class WarmPool:
    def __init__(
        self,
        cfg: SandboxConfig | None = None,
        size: int | None = None,
        preload: tuple[str, ...] = (),
        answer_s: float = 5.0,
    ):
        self.cfg = cfg or SandboxConfig()
        self.preload = preload
        """Trusted code every sandbox's resident compiles once (sandboxes.open_sandbox)."""
        self.size = self.cfg.pool_size if size is None else size
        self.ready: queue.Queue[Any] = queue.Queue()
        self.created = 0
        self.replaced = 0
        """Sandboxes found dead or hung at `take` and replaced."""
        self.answer_s = answer_s
        """How long a pooled sandbox's resident may take to answer its ping at `take`."""
        self.last_error = ""
        """Why the last background refill failed (empty once one succeeds)."""
        self._want = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refill, name="sandbox-pool", daemon=True)
        self._want.set()
        self._thread.start()

    def _refill(self) -> None:
        while not self._stop.is_set():
            self._want.wait(0.5)
            self._want.clear()
            while not self._stop.is_set() and self.ready.qsize() < self.size:
                try:
                    self.ready.put(open_sandbox(self.cfg, self.preload))
                    self.created += 1
                    self.last_error = ""
                except Exception as e:  # noqa: BLE001 (any failure: the pool must outlive it)
                    self.last_error = f"{type(e).__name__}: {e}"
                    self._stop.wait(1.0)
                    break

    def take(self, timeout: float = 0.0) -> Any:
        """A ready sandbox whose resident answers; a new one if none is ready
        within `timeout` seconds."""
        while True:
            try:
                sb = self.ready.get(timeout=timeout) if timeout else self.ready.get_nowait()
            except queue.Empty:
                sb = open_sandbox(self.cfg, self.preload)  # it answered its first greeting just now
                self.created += 1
                self._want.set()
                return sb
            self._want.set()
            if sb.answers(self.answer_s):  # closes one that does not
                return sb
            self.replaced += 1

    def give(self, sb: Any, clean: bool = False) -> None:
        """Return a sandbox after an episode: reset (unless `clean`: it was
        reset already, as by `run_snippet(reset_after=True)`) and pooled, or
        closed."""
        try:
            if sb.alive and self.ready.qsize() < self.size:
                if not clean:
                    sb.reset()
                self.ready.put(sb)
                return
        except SandboxError:
            pass
        sb.close()

    def close(self) -> None:
        self._stop.set()
        self._want.set()
        self._thread.join(timeout=10)
        while True:
            try:
                sb = self.ready.get_nowait()
            except queue.Empty:
                break
            with contextlib.suppress(Exception):
                sb.close()

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
