"""A generator's HTTP service: token ids in, token ids and log-probs out.

Every request carries the run's secret (`Authorization: Bearer TOKEN`,
rl.serving.announcements.run_secret); without it the answer is 401.

    POST /generate  {"prompts": [[ids...], ...], "sampling": {...}}
      200 {"version": V, "outputs": [[{"token_ids", "logprobs", "finish_reason"}, ...], ...],
           "queue_s", "generate_s", "backend"}
      400 {"error": "..."}   a bad request: the message names the field (also when
                             prompts x n exceeds max_batch, or the body is too deep)
      401 {"error": "..."}   no or a wrong secret
      503 {"error": "...", "retry_after_s": S}   queue full (back-pressure): try later or elsewhere
    GET /health     {"version", "backend", "queued", "busy", "served", "tokens", "generate_s", "swap_s", "swapping"}

Requests wait in one queue, served by one engine thread:

* continuous batching (vLLM): each request joins the running batch at the
  next decoding step, as long as at most `max_batch` sequences are in
  flight, and is answered as soon as its own completions finish;
* whole batches (HF): the oldest request and every queued request with the
  same sampling parameters, up to `max_batch` completions, run as one
  `generate` call.

The service bounds what one client can hold (rl.serving.intake): a
request must arrive whole within `io_timeout_s`, however steadily its bytes
trickle in; only a whole request gets a thread; a flood of slow clients
cannot keep a fast one out; at most `max_connections` requests are answered
at once (more are answered 503 at once); and a request's prompts x n may not
exceed `max_batch`. Every answer closes its connection.

A weight swap stops admitting requests, lets those in flight finish, loads
the new version while the queue is held, and admits again: every response
is produced by exactly one version, which it names.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from pydantic import ValidationError

from rl.engine import BadRequest, Completion, Engine, check_prompts
from rl.engine.config import SamplingParams
from rl.serving.intake import Intake, WholeRequestHandler

log = logging.getLogger("sarl.generator")
MAX_BODY = 64 << 20


def _one_sample(params: SamplingParams, j: int) -> SamplingParams:
    """Sample j of a request's n, as a request of its own: one completion,
    seeded from the request's seed and j (the same request gives the same
    completions whatever else the engine runs)."""
    seed = None if params.seed is None else (params.seed * 1_000_003 + j) % 2**63
    return params.model_copy(update={"n": 1, "seed": seed})


def validation_message(e: ValidationError, prefix: str) -> str:
    """`sampling.temperature: Input should be ...` for each error."""
    return "; ".join(
        f"{'.'.join([prefix, *(str(p) for p in err['loc'])])}: {err['msg']}" for err in e.errors(include_url=False)
    )


@dataclass
class Pending:
    prompts: list[list[int]]
    params: SamplingParams
    at: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    outputs: list[list[Completion]] | None = None
    version: int = -1
    error: str | None = None
    started: float = 0.0
    finished: float = 0.0
    left: int = 0
    """Sequences still to finish (continuous batching)."""
    slots: list[list[Completion | None]] = field(default_factory=list)
    """Completion j of prompt i, as each finishes (continuous batching)."""


class GeneratorServer:
    """Serves `engine` over HTTP until `stop()`."""

    def __init__(
        self,
        engine: Engine,
        bind: str = "0.0.0.0",
        port: int = 0,
        max_queue: int = 256,
        max_batch: int = 64,
        request_timeout_s: float = 900.0,
        *,
        token: str,
        io_timeout_s: float = 30.0,
        max_connections: int = 512,
    ):
        if not token:
            raise ValueError("a generator needs the run's secret (rl.serving.announcements.run_secret)")
        self.engine = engine
        self.token = token
        self.io_timeout_s = io_timeout_s
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.request_timeout_s = request_timeout_s
        self.queue: deque[Pending] = deque()
        self.cond = threading.Condition()
        self.swapping = False
        self.busy = False
        self.stopping = False
        self.served = 0
        self.tokens = 0
        self.generate_s = 0.0
        self.swap_s = 0.0
        """Seconds spent loading weight versions: the generator's own work, not waiting."""
        handler: Any = _handler(self)

        def answer(sock: socket.socket, addr: Any, data: bytes) -> None:
            handler((sock, data), addr, None)  # answers in its constructor, as socketserver's handlers do

        self.intake = Intake(
            (bind, port),
            answer,
            deadline_s=io_timeout_s,
            max_handlers=max_connections,
            max_body=MAX_BODY,
        )
        self.port = self.intake.port
        self.threads = [threading.Thread(target=self._engine_loop, name="engine", daemon=True)]

    def start(self) -> GeneratorServer:
        self.intake.start()
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            for p in self.queue:
                p.error = "the generator is stopping"
                p.done.set()
            self.queue.clear()
            self.cond.notify_all()
        self.intake.stop()

    # ------------------------------------------------------------- requests
    def submit(self, prompts: list[list[int]], params: SamplingParams) -> Pending | None:
        """Queue a request; None when the queue is full."""
        p = Pending(prompts, params)
        with self.cond:
            if len(self.queue) >= self.max_queue or self.stopping:
                return None
            self.queue.append(p)
            self.cond.notify_all()
        return p

    def _take_batch(self) -> list[Pending]:
        """The oldest request and the queued ones that can share its batch."""
        first = self.queue.popleft()
        batch, size = [first], len(first.prompts) * first.params.n
        # A seeded request on the hf backend runs alone: its tokens must not
        # depend on what else happens to be queued.
        if not (self.engine.backend == "hf" and first.params.seed is not None):
            for p in list(self.queue):
                if p.params == first.params and size + len(p.prompts) * p.params.n <= self.max_batch:
                    self.queue.remove(p)
                    batch.append(p)
                    size += len(p.prompts) * p.params.n
        return batch

    def _engine_loop(self) -> None:
        if self.engine.continuous:
            self._continuous_loop()
        else:
            self._batch_loop()

    def _continuous_loop(self) -> None:
        """Continuous batching (vLLM). Each completion (a prompt's sample j
        of n) is a sequence of its own in the engine, admitted only while
        (a) at most `max_batch` sequences are in flight, (b) the new prompt
        tokens of this step, with one token for each sequence already
        decoding, fit in the engine's step (`Engine.step_tokens`), and (c)
        every sequence in flight, prompt and `max_tokens`, fits in its KV
        cache (`Engine.kv_tokens`). So the engine never preempts a sequence,
        and is not handed more prompt than a step takes. (That a prompt is
        never split over steps is the engine's own setting: vLLM's engine
        core runs in a process of its own, on its own steps, so this loop
        cannot tell which admitted prompts it has prefilled; rl.engine.vllm
        turns chunked prefill off.) vLLM's CPU backend cannot rewind a
        seeded sequence's random generator after a split or a preemption
        ("CPU Generator does not use offset"), and its engine died when more
        than about 20 new prompts arrived at once. A request's sequences
        left waiting run with the same weight version: a swap waits for
        them."""
        inflight: dict[str, tuple[Pending, int, int, int]] = {}  # engine id -> (request, prompt, sample, KV reserved)
        waiting: deque[tuple[Pending, int, int]] = deque()  # sequences of started requests not in the engine yet
        reserved = 0
        ids = 0
        step_tokens, kv_tokens = self.engine.step_tokens, self.engine.kv_tokens
        while True:
            with self.cond:
                while not self.stopping and not inflight and not waiting and (self.swapping or not self.queue):
                    self.cond.wait()
                if self.stopping:
                    return
                version = self.engine.version
                while self.queue and not self.swapping and len(waiting) < self.max_batch:
                    p = self.queue.popleft()
                    p.version, p.started = version, time.monotonic()
                    p.outputs = [[] for _ in p.prompts]
                    p.slots = [[None] * p.params.n for _ in p.prompts]
                    p.left = len(p.prompts) * p.params.n
                    waiting += [(p, i, j) for i in range(len(p.prompts)) for j in range(p.params.n)]
                self.busy = True
            started = time.monotonic()
            new_tokens = 0
            while waiting:
                p, i, j = waiting[0]
                if p.error is not None:  # an earlier sequence of it was refused: the rest go nowhere
                    waiting.popleft()
                    p.left -= 1
                    if not p.left:
                        p.done.set()
                    continue
                prompt = p.prompts[i]
                need = len(prompt) + p.params.max_tokens
                if inflight or new_tokens:  # the first always goes: alone it fits (max_model_len)
                    if len(inflight) + 1 > self.max_batch:
                        break
                    if step_tokens and len(inflight) + new_tokens + len(prompt) > step_tokens:
                        break
                    if kv_tokens and reserved + need > kv_tokens:
                        break
                waiting.popleft()
                ids += 1
                try:
                    self.engine.add(str(ids), prompt, _one_sample(p.params, j))
                except Exception as e:  # refused by the engine: this request fails, not the others
                    p.error = f"engine error: {type(e).__name__}: {e}"
                    p.left -= 1
                    if not p.left:
                        p.done.set()
                    continue
                inflight[str(ids)] = (p, i, j, need)
                reserved += need
                new_tokens += len(prompt)
            try:
                finished = self.engine.step() if inflight else []
            except Exception as e:  # the engine failed: everything in flight fails with it
                log.exception("engine step failed")
                finished = []
                for p, _, _, _ in inflight.values():
                    p.error = f"engine error: {type(e).__name__}: {e}"
                    p.left = 0
                    p.done.set()
                inflight.clear()
                reserved = 0
            now = time.monotonic()
            answered = []
            for rid, completions in finished:
                p, i, j, need = inflight.pop(rid)
                reserved -= need
                p.slots[i][j] = completions[0]
                p.left -= 1
                if p.left == 0:
                    p.outputs = [[c for c in row if c is not None] for row in p.slots]
                    p.finished = now
                    answered.append(p)
            with self.cond:
                self._account(answered, now - started)
                if not inflight and not waiting:
                    self.busy = False
                    self.cond.notify_all()
            for p in answered:
                p.done.set()

    def _batch_loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and (self.swapping or not self.queue):
                    self.cond.wait()
                if self.stopping:
                    return
                batch = self._take_batch()
                self.busy = True
                version = self.engine.version
            started = time.monotonic()
            try:
                outs = self.engine.generate([pr for p in batch for pr in p.prompts], batch[0].params)
                k = 0
                for p in batch:
                    p.outputs = outs[k : k + len(p.prompts)]
                    k += len(p.prompts)
            except Exception as e:  # an engine failure fails this batch, not the service
                log.exception("generate failed")
                for p in batch:
                    p.error = f"engine error: {type(e).__name__}: {e}"
            finished = time.monotonic()
            with self.cond:
                self.busy = False
                self._account(batch, finished - started)
                self.cond.notify_all()
            for p in batch:
                p.version, p.started, p.finished = version, started, finished
                p.done.set()

    def _account(self, answered: list[Pending], engine_s: float) -> None:
        """Count what was served (caller holds `cond`)."""
        ok = [p for p in answered if p.error is None]
        self.served += sum(len(p.prompts) for p in ok)
        self.tokens += sum(len(c.token_ids) for p in ok for row in p.outputs or () for c in row)
        self.generate_s += engine_s

    # ----------------------------------------------------------------- swap
    def swap(self, store: str, version: int) -> float:
        """Load weight `version` between batches; requests queue meanwhile.
        Returns the seconds requests were held."""
        with self.cond:
            self.swapping = True
            while self.busy:
                self.cond.wait()
        t0 = time.monotonic()
        try:
            self.engine.load_version(store, version)
        finally:
            with self.cond:
                self.swap_s += time.monotonic() - t0
                self.swapping = False
                self.cond.notify_all()
        return time.monotonic() - t0

    def health(self) -> dict[str, Any]:
        with self.cond:
            return {
                "version": self.engine.version,
                "backend": self.engine.backend,
                "queued": len(self.queue),
                "busy": self.busy,
                "served": self.served,
                "tokens": self.tokens,
                "generate_s": round(self.generate_s, 3),
                "swap_s": round(self.swap_s, 3),
                "swapping": self.swapping,
            }


def _handler(server: GeneratorServer) -> type[BaseHTTPRequestHandler]:
    class GeneratorHandler(WholeRequestHandler):
        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            ok = hmac.compare_digest(given.encode(), f"Bearer {server.token}".encode())
            if not ok:
                self.close_connection = True
                self._reply(401, {"error": "missing or wrong run secret (Authorization: Bearer ...)"})
            return ok

        def _reply(self, code: int, body: dict[str, Any]) -> None:
            retry = {"Retry-After": str(int(body.get("retry_after_s", 1)))} if code == 503 else None
            self.reply_json(code, body, retry)

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/health":
                self._reply(200, server.health())
            else:
                self._reply(404, {"error": f"no such path {self.path!r}: GET /health, POST /generate"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if self.path != "/generate":
                self._reply(404, {"error": f"no such path {self.path!r}: GET /health, POST /generate"})
                return
            body = self.body()
            if body is None:
                self._reply(411, {"error": "a Content-Length header (a number >= 0) is required"})
                return
            try:
                prompts, params = self._parse(body)
            except BadRequest as e:
                self._reply(400, {"error": str(e)})
                return
            pending = server.submit(prompts, params)
            if pending is None:
                self._reply(503, {"error": f"busy: {server.max_queue} requests queued", "retry_after_s": 1})
                return
            if not pending.done.wait(server.request_timeout_s):
                self._reply(504, {"error": f"not served within {server.request_timeout_s} s"})
                return
            if pending.error is not None:
                self._reply(500, {"error": pending.error})
                return
            assert pending.outputs is not None
            self._reply(
                200,
                {
                    "version": pending.version,
                    "backend": server.engine.backend,
                    "outputs": [[c.to_json() for c in row] for row in pending.outputs],
                    "queue_s": round(pending.started - pending.at, 4),
                    "generate_s": round(pending.finished - pending.started, 4),
                },
            )

        def _parse(self, body: bytes) -> tuple[list[list[int]], SamplingParams]:
            try:
                req = json.loads(body)
            except ValueError as e:
                raise BadRequest(f"body is not JSON: {e}") from None
            except RecursionError:
                raise BadRequest("body is nested too deeply") from None
            if not isinstance(req, dict):
                raise BadRequest('body: expected an object {"prompts": [...], "sampling": {...}}')
            unknown = sorted(set(req) - {"prompts", "sampling"})
            if unknown:
                raise BadRequest(f"unknown field(s) {unknown}: expected prompts, sampling")
            try:
                params = SamplingParams.model_validate(req.get("sampling") or {})
            except ValidationError as e:
                raise BadRequest(validation_message(e, "sampling")) from None
            engine = server.engine
            prompts = check_prompts(req.get("prompts"), params, engine.vocab_size, engine.max_model_len)
            if len(prompts) * params.n > server.max_batch:
                raise BadRequest(
                    f"prompts x sampling.n = {len(prompts)} x {params.n} exceeds this generator's "
                    f"max_batch {server.max_batch}: split the request"
                )
            return prompts, params

    return GeneratorHandler
