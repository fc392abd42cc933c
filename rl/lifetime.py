"""Whether a process that left something behind (a pin, a private folder) is
still there: named by host and pid, it can be looked up only on its own host."""

from __future__ import annotations

import os
import socket


def alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (a pid reused since counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def gone(host: object, pid: object) -> bool:
    """Whether the process `pid` of `host` is known to have ended: only a
    process of this host can be looked up (False for any other)."""
    return host == socket.gethostname() and isinstance(pid, int) and not alive(pid)


def tag() -> str:
    """`HOST-PID` of this process: what `gone` is asked about later."""
    return f"{socket.gethostname()}-{os.getpid()}"
