"""Where sandbox processes are started: one long-lived thread per process.

bubblewrap's `--die-with-parent` (sandboxes/isolation.py) sets
PR_SET_PDEATHSIG, and Linux sends that signal when the parent *thread*
ends, not the parent process. A sandbox started from a short-lived thread (a
`ThreadPoolExecutor` worker of `Verifier.verify_many` taking a sandbox
when the warm pool was empty) was SIGKILLed the moment that thread ended,
while it sat ready in the pool: the next verification to take it found it
dead ("sandbox resident died", "sandbox is closed or dead"). Which thread
made a pooled sandbox depends on timing, so the failure came and went with
the load on the machine.

Every sandbox process is therefore started by `spawn`, which hands the
`Popen` to a daemon thread that lives as long as the process: the sandbox
still dies with the worker (that thread ends only with it) and never with
the thread that asked for it. A process made by `fork` (multiprocessing)
gets a thread of its own on first use.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from concurrent.futures import Future
from typing import Any

_lock = threading.Lock()
_requests: queue.SimpleQueue[tuple[Future[subprocess.Popen[bytes]], list[str], dict[str, Any]]] | None = None
_owner = 0
"""The pid whose spawner thread `_requests` feeds (a forked child has none)."""


def _serve(requests: queue.SimpleQueue[tuple[Future[subprocess.Popen[bytes]], list[str], dict[str, Any]]]) -> None:
    while True:
        done, argv, kwargs = requests.get()
        if not done.set_running_or_notify_cancel():
            continue
        try:
            done.set_result(subprocess.Popen(argv, **kwargs))
        except BaseException as e:  # noqa: BLE001 (handed to the caller, who raises it)
            done.set_exception(e)


def _spawner() -> queue.SimpleQueue[tuple[Future[subprocess.Popen[bytes]], list[str], dict[str, Any]]]:
    global _requests, _owner
    with _lock:
        if _requests is None or _owner != os.getpid():
            _requests = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(_requests,), name="sandbox-spawner", daemon=True).start()
            _owner = os.getpid()
        return _requests


def spawn(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **popen_kwargs)`, started by this process's
    spawner thread; raises what Popen raised. The caller keeps ownership of
    any fd in `pass_fds` (close it after this returns, as with Popen)."""
    done: Future[subprocess.Popen[bytes]] = Future()
    _spawner().put((done, argv, popen_kwargs))
    return done.result()
