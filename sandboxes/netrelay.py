"""The network allow-list: TCP relays across the sandbox's network namespace.

A sandbox has its own network namespace with only loopback: nothing outside
is reachable. For each allowed `host:port`, the host listens on a Unix
socket (bind-mounted into the sandbox) and relays each connection to
`host:port`; inside, the resident listens on `127.0.0.1:port` and relays to that
Unix socket. Code in the sandbox reaches exactly the allowed ports, at
127.0.0.1, and nothing else: no routes, no DNS.

`pump` and `serve_relay` are shared by both sides (this file is stdlib-only
and is also run inside the sandbox by the resident).
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


MAX_CONNECTIONS = 16
"""Relayed connections open at once per sandbox; each costs two threads and
an upstream connection. Beyond it, a new connection is closed at once."""


class Connections:
    """The relayed connections of one sandbox: capped, and all closed (their
    threads then end) when the sandbox closes."""

    def __init__(self, cap: int = MAX_CONNECTIONS):
        self.cap = cap
        self.lock = threading.Lock()
        self.open: set[socket.socket] = set()
        self.refused = 0

    def admit(self, conn: socket.socket) -> bool:
        with self.lock:
            if len(self.open) >= self.cap:
                self.refused += 1
                return False
            self.open.add(conn)
            return True

    def relay(self, conn: socket.socket, upstream: socket.socket) -> None:
        with self.lock:
            self.open.add(upstream)
        try:
            pump(conn, upstream)
        finally:
            with self.lock:
                self.open.discard(conn)
                self.open.discard(upstream)

    def close_all(self) -> None:
        with self.lock:
            socks, self.open = list(self.open), set()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def serve_relay(
    listener: socket.socket, connect: Callable[[], socket.socket], stop: threading.Event, conns: Connections
) -> None:
    """Accept on `listener`; relay each admitted connection to a fresh `connect()`."""
    listener.settimeout(0.5)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        if not conns.admit(conn):
            conn.close()
            continue
        try:
            upstream = connect()
        except OSError:
            with conns.lock:
                conns.open.discard(conn)
            conn.close()
            continue
        threading.Thread(target=conns.relay, args=(conn, upstream), daemon=True).start()


class HostRelays:
    """Host side: one Unix socket per allowed `host:port`, in `folder`."""

    def __init__(self, allow: list[str], folder: str, max_connections: int = MAX_CONNECTIONS):
        self.stop = threading.Event()
        self.conns = Connections(max_connections)
        self._threads: list[threading.Thread] = []
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

            t = threading.Thread(target=serve_relay, args=(lst, connect, self.stop, self.conns), daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop accepting, close every relayed connection, and wait for the threads."""
        self.stop.set()
        for lst in self._listeners:
            with contextlib.suppress(OSError):
                lst.close()
        self.conns.close_all()
        for t in self._threads:
            t.join(timeout=2)
        for path in self.sockets.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def start_inside(folder: str) -> None:
    """Inside the sandbox: listen on 127.0.0.1:PORT for each PORT.sock in `folder`."""
    if not os.path.isdir(folder):
        return
    stop = threading.Event()
    conns = Connections()
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

        threading.Thread(target=serve_relay, args=(lst, connect, stop, conns), daemon=True).start()
