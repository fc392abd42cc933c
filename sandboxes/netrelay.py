"""The network allow-list: TCP relays across the sandbox's network namespace.

A sandbox has its own network namespace with only loopback: nothing outside
is reachable. For each allowed `host:port`, the host listens on a Unix
socket (bind-mounted into the sandbox) and relays each connection to
`host:port`; inside, the agent listens on `127.0.0.1:port` and relays to that
Unix socket. Code in the sandbox reaches exactly the allowed ports, at
127.0.0.1, and nothing else: no routes, no DNS.

`pump` and `serve_relay` are shared by both sides (this file is stdlib-only
and is also run inside the sandbox by the agent).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable


def pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""

    def one_way(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=one_way, args=(b, a), daemon=True)
    t.start()
    one_way(a, b)
    t.join()
    a.close()
    b.close()


def serve_relay(listener: socket.socket, connect: Callable[[], socket.socket], stop: threading.Event) -> None:
    """Accept on `listener`; relay each connection to a fresh `connect()`."""
    listener.settimeout(0.5)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        try:
            upstream = connect()
        except OSError:
            conn.close()
            continue
        threading.Thread(target=pump, args=(conn, upstream), daemon=True).start()


class HostRelays:
    """Host side: one Unix socket per allowed `host:port`, in `folder`."""

    def __init__(self, allow: list[str], folder: str):
        self.stop = threading.Event()
        self.sockets: dict[int, str] = {}  # port inside the sandbox -> unix socket path on the host
        self._listeners: list[socket.socket] = []
        os.makedirs(folder, exist_ok=True)
        for entry in allow:
            host, _, port_s = entry.rpartition(":")
            if not host or not port_s.isdigit():
                raise ValueError(f"network allow-list entry {entry!r}: expected host:port")
            port = int(port_s)
            path = os.path.join(folder, f"{port}.sock")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            lst.bind(path)
            os.chmod(path, 0o777)  # the sandbox's uid connects to it
            lst.listen(64)
            self._listeners.append(lst)
            self.sockets[port] = path

            def connect(h: str = host, p: int = port) -> socket.socket:
                return socket.create_connection((h, p), timeout=10)

            threading.Thread(target=serve_relay, args=(lst, connect, self.stop), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        for lst in self._listeners:
            with contextlib.suppress(OSError):
                lst.close()
        for path in self.sockets.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def start_inside(folder: str) -> None:
    """Inside the sandbox: listen on 127.0.0.1:PORT for each PORT.sock in `folder`."""
    if not os.path.isdir(folder):
        return
    stop = threading.Event()
    for name in os.listdir(folder):
        if not name.endswith(".sock"):
            continue
        port = int(name[:-5])
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", port))
        lst.listen(64)
        path = os.path.join(folder, name)

        def connect(p: str = path) -> socket.socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(p)
            return s

        threading.Thread(target=serve_relay, args=(lst, connect, stop), daemon=True).start()
