"""The client of the generator array, for rollout workers.

Generators announce themselves in `RUN/endpoints/` (rl.serving.announcements),
rewritten every few seconds. The client:

* discovers live generators from those files (older than `stale_s`: gone);
* sends each request to the generator with the fewest requests in flight
  from this client, then the fewest sent by it (round robin), then the
  shortest announced queue;
* retries elsewhere when a generator refuses the connection, times out or
  fails, and leaves that generator out for `dead_s`;
* stops waiting for an answer once the generator's announcements fall
  silent (more than `silent_s`, or ten of its announcement intervals): a
  stopped process (SIGSTOP, a frozen node or device) keeps the connection
  open and answers nothing, until recovery kills it or `timeout_s` passes;
* backs off when a generator answers 503 (its queue is full);
* bounds its own requests in flight (`max_inflight`): callers beyond that
  wait, which is the back-pressure a rollout worker feels;
* raises `BadRequest` at once for a request a generator refuses as invalid
  (sending it elsewhere would not help);
* gives up at once, with `NoGenerator`, once `stop` is set (its worker is
  preempted: a wait for a generator must not hold the requeue back).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import select
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.engine import BadRequest, Completion
from rl.engine.config import SamplingParams
from rl.errors import SarlError
from rl.layout import RunLayout
from rl.serving.announcements import Endpoint, read_endpoint, read_endpoints, run_secret


class NoGenerator(SarlError, RuntimeError):
    """No generator could serve the request within the attempts allowed."""


@dataclass
class Response:
    version: int
    """The weight version that produced every output of this response."""
    outputs: list[list[Completion]]
    endpoint: Endpoint
    attempts: int
    """Generators tried: more than 1 when one failed and another served it."""
    waited_s: float = 0.0
    """Seconds spent waiting before a generator took the request: for a slot
    (`max_inflight`), for a generator to appear, and backing off full ones."""


class GeneratorClient:
    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        timeout_s: float = 300.0,
        attempts: int = 8,
        stale_s: float = 30.0,
        dead_s: float = 30.0,
        max_inflight: int = 64,
        wait_for_generator_s: float = 60.0,
        stop: threading.Event | None = None,
        silent_s: float = 5.0,
    ):
        self.run_dir = Path(run_dir)
        self.stop = stop or threading.Event()
        self.silent_s = silent_s
        self._announced: dict[int, tuple[float, Endpoint | None]] = {}
        """Generator task -> (when read, its announcement): read at most once a second."""
        self.auth = f"Bearer {run_secret(self.run_dir)}"
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.stale_s = stale_s
        self.dead_s = dead_s
        self.wait_for_generator_s = wait_for_generator_s
        self.slots = threading.BoundedSemaphore(max_inflight)
        self.lock = threading.Lock()
        self.inflight: dict[str, int] = defaultdict(int)
        self.sent: dict[str, int] = defaultdict(int)
        self.dead_until: dict[str, float] = {}
        self.failures: dict[str, int] = defaultdict(int)
        """Connection failures and timeouts seen, per endpoint."""
        self.errors: dict[str, int] = defaultdict(int)
        """Requests a live generator answered with a server error, per endpoint."""

    def endpoints(self) -> list[Endpoint]:
        """Live generators, minus those this client saw fail recently."""
        now = time.monotonic()
        with self.lock:
            live = read_endpoints(self.run_dir, self.stale_s, time.time())
            return [e for e in live if self.dead_until.get(e.key, 0) <= now]

    def _pick(self, eps: list[Endpoint]) -> Endpoint:
        with self.lock:
            ep = min(eps, key=lambda e: (self.inflight[e.key], self.sent[e.key], e.queued, random.random()))
            self.sent[ep.key] += 1
            return ep

    def generate(self, prompts: list[list[int]], sampling: SamplingParams | dict[str, Any]) -> Response:
        """Sample completions for `prompts` on some live generator."""
        params = sampling if isinstance(sampling, SamplingParams) else SamplingParams.model_validate(sampling)
        body = json.dumps({"prompts": prompts, "sampling": params.model_dump(mode="json")}).encode()
        last = "no generator has announced itself in " + str(RunLayout(self.run_dir).endpoints_path)
        backoff = 0.2
        waited_since = time.monotonic()
        with self.slots:
            waited = time.monotonic() - waited_since
            attempt = 0
            while attempt < self.attempts:
                if self.stop.is_set():
                    raise NoGenerator("the client is stopping")
                eps = self.endpoints()
                if not eps:
                    if time.monotonic() - waited_since > self.wait_for_generator_s:
                        break
                    self.stop.wait(min(backoff, 2.0))
                    waited += min(backoff, 2.0)
                    backoff *= 1.5
                    continue
                attempt += 1
                ep = self._pick(eps)
                try:
                    status, reply = self._post(ep, body)
                except (OSError, http.client.HTTPException) as e:
                    last = f"{ep.key} (generator task {ep.task}): {type(e).__name__}: {e}"
                    self._mark_dead(ep)
                    continue
                if status == 200:
                    outputs = [[Completion(**c) for c in row] for row in reply["outputs"]]
                    return Response(int(reply["version"]), outputs, ep, attempt, round(waited, 4))
                last = f"{ep.key} (generator task {ep.task}): HTTP {status}: {reply.get('error', reply)}"
                if status == 400:
                    raise BadRequest(str(reply.get("error", reply)))
                if status == 401:
                    raise NoGenerator(f"{last}; clients read the secret from {self.run_dir / 'secret'}")
                if status == 503:  # full: back off, then the least loaded again
                    self.stop.wait(pause := min(float(reply.get("retry_after_s", 1)), backoff))
                    waited += pause
                    backoff = min(backoff * 2, 5.0)
                    continue
                # Another 5xx: the generator is alive and answered, but failed this
                # request. Try elsewhere; only a generator that does not answer is
                # left out for `dead_s`.
                self.errors[ep.key] += 1
        raise NoGenerator(f"no generator served the request after {attempt} attempt(s); last: {last}")

    def _await_answer(self, conn: http.client.HTTPConnection, ep: Endpoint) -> None:
        """Until the answer starts to arrive: raises TimeoutError after
        `timeout_s`, ConnectionAbortedError once `ep` has fallen silent."""
        sent = time.monotonic()
        while not select.select([conn.sock], [], [], 1.0)[0]:
            if time.monotonic() - sent > self.timeout_s:
                raise TimeoutError(f"no answer in {self.timeout_s:.0f} s")
            silent = self._silent(ep)
            if silent:
                raise ConnectionAbortedError(silent)

    def _silent(self, ep: Endpoint) -> str:
        """Why `ep` is taken as stopped (empty: it is not): its announcement
        is older than `silent_s` and ten of its intervals, or another
        process announces under its task. A withdrawn announcement is a
        generator shutting down, which answers or closes the connection."""
        now = time.monotonic()
        with self.lock:
            read_at, cur = self._announced.get(ep.task, (float("-inf"), None))
            if now - read_at >= 1.0:
                cur = read_endpoint(self.run_dir, ep.task)
                self._announced[ep.task] = (now, cur)
        if cur is None:
            return ""
        if cur.key != ep.key:
            return f"generator task {ep.task} is announced by another process now ({cur.key})"
        limit = max(self.silent_s, 10 * cur.every_s) if cur.every_s else self.stale_s
        age = time.time() - cur.at
        return f"silent for {age:.0f} s (more than {limit:.0f} s): stopped" if age > limit else ""

    def _mark_dead(self, ep: Endpoint) -> None:
        with self.lock:
            self.dead_until[ep.key] = time.monotonic() + self.dead_s
            self.failures[ep.key] += 1

    def _post(self, ep: Endpoint, body: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.inflight[ep.key] += 1
        conn = http.client.HTTPConnection(ep.addr, ep.port, timeout=self.timeout_s)
        try:
            conn.request("POST", "/generate", body, {"Content-Type": "application/json", "Authorization": self.auth})
            self._await_answer(conn, ep)
            resp = conn.getresponse()
            data = resp.read()
            try:
                reply = json.loads(data)
            except ValueError:
                reply = {"error": data[:200].decode(errors="replace")}
            return resp.status, reply
        finally:
            conn.close()
            with self.lock:
                self.inflight[ep.key] -= 1
