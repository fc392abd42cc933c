"""How a generator's HTTP service takes requests in: whole, in time, and
without letting slow clients starve fast ones.

One intake thread accepts connections and reads their requests with a
selector, never blocking on a client. A request (request line, headers and
a `Content-Length` body) must arrive whole within `deadline_s` of its
connection; one that does not is answered 408 and closed, however steadily
its bytes trickle in. Only a request that has arrived whole is given a
thread of its own, where the handler answers it; so a client that sends a
byte every few seconds holds a socket for at most `deadline_s`, never a
thread. At most `max_pending` connections may be mid-request; a newcomer
beyond that closes the one that has waited longest (the slowest), so that
a flood of slow clients cannot keep a fast one out. At most `max_handlers`
requests are answered at once; beyond that a whole request is answered 503
at once.

Each connection carries one request: every answer closes it (the sarl
client opens a connection per request; HTTP clients with connection pools
open another).

Not covered: a client that reads its answer slowly holds its handler's
thread for up to `deadline_s` per send (answers are small: token ids).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

log = logging.getLogger("sarl.generator")

MAX_HEAD = 64 << 10
"""Bytes of request line and headers at most."""


def _answer(code: int, reason: str, body: bytes, retry_after: bool = False) -> bytes:
    head = f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    if retry_after:
        head += "Retry-After: 1\r\n"
    return (head + "Connection: close\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Refusals:
    """The answers the intake gives by itself, before any handler: the
    generator's `{"error": "..."}`, or another API's shape."""

    timed_out: bytes = _answer(408, "Request Timeout", b'{"error": "the request did not arrive whole in time"}')
    busy: bytes = _answer(503, "Service Unavailable", b'{"error": "busy: too many requests", "retry_after_s": 1}', True)
    too_large: bytes = _answer(413, "Content Too Large", b'{"error": "request too large"}')

    @classmethod
    def shaped(cls, body: Callable[[int, str], bytes]) -> Refusals:
        """The same refusals, each body made by `body(status, message)`."""
        return cls(
            _answer(408, "Request Timeout", body(408, "the request did not arrive whole in time")),
            _answer(503, "Service Unavailable", body(503, "busy: too many requests"), True),
            _answer(413, "Content Too Large", body(413, "request too large")),
        )


class WholeRequestHandler(BaseHTTPRequestHandler):
    """Answers one request that arrived whole (`request`: the socket and
    the request's bytes): what an Intake hands its `handle`, as
    `Handler((sock, data), addr, None)`, which answers in its constructor."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.connection, data = self.request
        self.rfile = io.BytesIO(data)
        self.wfile = socketserver._SocketWriter(self.connection)  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("%s " + format, self.address_string(), *args)

    def reply_json(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> bytes | None:
        """The request's body (whole: the intake waited for it, within its
        `max_body`), or None when it has no Content-Length (answer 411)."""
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return None
        return self.rfile.read(length) if length >= 0 else None


@dataclass
class _Arrival:
    sock: socket.socket
    addr: Any
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    need: int | None = None
    """Total bytes of the request once its headers are in (head + body)."""


@dataclass
class Counts:
    """What the intake did since it started (for tests and benchmarks)."""

    accepted: int = 0
    handled: int = 0
    timed_out: int = 0
    evicted: int = 0
    busy: int = 0


class Intake:
    """Accepts connections on `address` and calls `handle(sock, addr, data)`
    on a thread of its own for each request that arrived whole (`data`:
    its bytes); the handler answers on `sock`, which is closed after it."""

    def __init__(
        self,
        address: tuple[str, int],
        handle: Callable[[socket.socket, Any, bytes], None],
        *,
        deadline_s: float = 30.0,
        max_pending: int = 1024,
        max_handlers: int = 512,
        max_body: int = 64 << 20,
        refusals: Refusals | None = None,
    ):
        self.handle, self.deadline_s, self.max_pending, self.max_body = handle, deadline_s, max_pending, max_body
        self.refusals = refusals or Refusals()
        self.handlers = threading.BoundedSemaphore(max_handlers)
        self.listener = socket.create_server(address, backlog=1024)
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.pending: dict[socket.socket, _Arrival] = {}
        self.counts = Counts()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="intake", daemon=True)

    def start(self) -> Intake:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        for arrival in list(self.pending.values()):
            self._drop(arrival)
        with contextlib.suppress(OSError):
            self.listener.close()
        self.selector.close()

    # ---------------------------------------------------------------- loop
    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(timeout=0.2):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._read(self.pending[key.fileobj])  # type: ignore[index]
            now = time.monotonic()
            for arrival in [a for a in self.pending.values() if a.deadline <= now]:
                self.counts.timed_out += 1
                self._drop(arrival, self.refusals.timed_out)

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: leave the rest in the backlog for now
                log.warning("accept failed: %s", e)
                return
            self.counts.accepted += 1
            if len(self.pending) >= self.max_pending:  # the slowest makes room for the newcomer
                oldest = min(self.pending.values(), key=lambda a: a.deadline)
                self.counts.evicted += 1
                self._drop(oldest, self.refusals.timed_out)
            sock.setblocking(False)
            arrival = _Arrival(sock, addr, time.monotonic() + self.deadline_s)
            self.pending[sock] = arrival
            self.selector.register(sock, selectors.EVENT_READ)

    def _read(self, a: _Arrival) -> None:
        try:
            chunk = a.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away before its request was whole
            self._drop(a)
            return
        a.data += chunk
        if a.need is None:
            end = a.data.find(b"\r\n\r\n")
            if end < 0:
                if len(a.data) > MAX_HEAD:
                    self._drop(a, self.refusals.too_large)
                return
            a.need = end + 4 + _content_length(bytes(a.data[:end]))
            if a.need - end - 4 > self.max_body:
                self._drop(a, self.refusals.too_large)
                return
        if len(a.data) >= a.need:
            self._dispatch(a)

    def _dispatch(self, a: _Arrival) -> None:
        self.selector.unregister(a.sock)
        del self.pending[a.sock]
        if not self.handlers.acquire(blocking=False):
            self.counts.busy += 1
            self._close(a.sock, self.refusals.busy)
            return
        self.counts.handled += 1
        data = bytes(a.data[: a.need])
        threading.Thread(target=self._serve, args=(a.sock, a.addr, data), name="request", daemon=True).start()

    def _serve(self, sock: socket.socket, addr: Any, data: bytes) -> None:
        try:
            sock.setblocking(True)
            sock.settimeout(self.deadline_s)  # each send of the answer
            self.handle(sock, addr, data)
        except Exception:  # noqa: BLE001 (one request must never take the service down)
            log.exception("request from %s failed", addr)
        finally:
            self.handlers.release()
            self._close(sock)

    # --------------------------------------------------------------- parts
    def _drop(self, a: _Arrival, answer: bytes = b"") -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(a.sock)
        self.pending.pop(a.sock, None)
        self._close(a.sock, answer)

    @staticmethod
    def _close(sock: socket.socket, answer: bytes = b"") -> None:
        if answer:
            with contextlib.suppress(OSError):
                sock.setblocking(False)
                sock.send(answer)  # what fits at once: never wait on a client here
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


def _content_length(head: bytes) -> int:
    """The body's length from a request's headers (0 without one, or a bad one:
    the handler answers those)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                return max(0, int(value.strip()))
            except ValueError:
                return 0
    return 0
