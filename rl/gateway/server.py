"""An OpenAI-compatible endpoint in front of sarl's generators.

    GET  /v1/models             the served model, under its name and under
                                `NAME@vV` (V: the live weight version)
    POST /v1/chat/completions   messages, tools, tool_choice, n, temperature,
                                top_p, max_tokens / max_completion_tokens,
                                stop, seed, logprobs, stream
    POST /v1/completions        prompt (text, texts, ids, lists of ids), ...
    GET  /health                the live version and what was served

Why a gateway beside the generators rather than routes inside them: a
session's calls must be recorded in one place while its requests may go to
any generator of the array (balanced, failed over); the gateway holds the
session and the generators stay token-in, token-out. It costs one local
HTTP hop per request (`sarl bench endpoint` measures it). `sarl serve` runs
the same gateway on a generator service in its own process.

Every request carries a bearer token: the endpoint's key (the run's secret,
or `SARL_API_KEY` for `sarl serve`), or a session's own key, which binds
the request to that session (an episode: rl.gateway.capture). With the
endpoint's key a session is named by the `X-Sarl-Session` header or by
the base URL `/s/SESSION/v1`. Every call of a session is recorded: the
prompt ids fed to the engine, the sampled ids, their log-probs, and the
weight version.

Requests arrive through the generators' own intake (rl.serving.intake):
whole within `io_timeout_s` however slowly they trickle, at most
`max_connections` answered at once, bodies of at most `max_body` bytes.
A request is checked whole before it reaches an engine (rl.gateway.api):
`n` at most `max_n`, at most `max_messages` messages, a prompt and its
`max_tokens` within the model's context (else `context_length_exceeded`).
Errors have the API's shape and status codes.

`tool_choice` "required" or a named function is held by feeding the
opening of a call as the end of the prompt (rl.gateway.render.forced_start).

Not covered: streaming sends a reply's chunks once its completion is done
(the engines answer whole completions), so it saves the client no latency;
a forced call's arguments are sampled freely (no constrained decoding);
`top_logprobs` is 0 (the engines return the sampled token's log-prob only).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any

from rl.engine.base import Completion
from rl.engine.config import SamplingParams
from rl.gateway.api import ApiError, ChatRequest, CompletionRequest, error_body, parse
from rl.gateway.backends import Backend
from rl.gateway.capture import CapturedCall, Session, Sessions
from rl.gateway.chunks import chat_chunks, token_logprob
from rl.gateway.render import conversation, forced_start, pieces, reply, reply_message, template_messages, trimmed
from rl.model import chat_ids
from rl.serving.intake import Intake, Refusals, WholeRequestHandler

log = logging.getLogger("sarl.gateway")

_SESSION_PATH = re.compile(r"^/s/([A-Za-z0-9._:-]{1,200})(/v1/.*)$")


class Gateway:
    """Serves `backend` under the OpenAI API until `stop()`."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Any,
        *,
        model: str,
        token: str,
        sessions: Sessions | None = None,
        bind: str = "127.0.0.1",
        port: int = 0,
        max_n: int = 16,
        max_messages: int = 1024,
        max_body: int = 8 << 20,
        io_timeout_s: float = 30.0,
        max_connections: int = 256,
    ):
        if not token:
            raise ValueError("an endpoint needs a key")
        self.backend, self.tokenizer, self.model, self.token = backend, tokenizer, model, token
        self.sessions = sessions
        self.max_n, self.max_messages = max_n, max_messages
        self.tok_lock = threading.Lock()  # a fast tokenizer is not safe across threads ("Already borrowed")
        self.served = self.tokens = self.errors = 0
        self.raw: dict[str, str] = {}
        """The exact text of recent replies, by their plain form (rl.gateway.render.template_messages)."""
        handler = _handler(self)
        self.intake = Intake(
            (bind, port),
            lambda sock, addr, data: handler((sock, data), addr, None),
            deadline_s=io_timeout_s,
            max_handlers=max_connections,
            max_body=max_body,
            refusals=Refusals.shaped(error_body),
        )
        self.port = self.intake.port
        self.bind = bind

    def start(self) -> Gateway:
        self.intake.start()
        return self

    def stop(self) -> None:
        self.intake.stop()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.bind in ("0.0.0.0", "") else self.bind
        return f"http://{host}:{self.port}/v1"

    # --------------------------------------------------------------- models
    def models(self) -> list[dict[str, Any]]:
        v = self.backend.version()
        card = {"object": "model", "created": 0, "owned_by": "sarl", "version": v}
        return [{**card, "id": self.model}, {**card, "id": f"{self.model}@v{v}"}]

    def check_model(self, name: str) -> None:
        if name == self.model:
            return
        v = self.backend.version()
        if name.startswith(self.model + "@v"):
            if name == f"{self.model}@v{v}":
                return
            raise ApiError(
                404,
                f"The model `{name}` is not served: the live version is {v} ({self.model}@v{v})",
                param="model",
                code="model_not_found",
            )
        raise ApiError(
            404,
            f"The model `{name}` does not exist: this endpoint serves `{self.model}` (GET /v1/models)",
            param="model",
            code="model_not_found",
        )

    # ----------------------------------------------------------------- chat
    def chat(self, req: ChatRequest, session: Session | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The response, and its stream's chunks."""
        self.check_model(req.model)
        if req.n > self.max_n:
            raise ApiError(400, f"n: {req.n} is more than this endpoint's {self.max_n}", param="n")
        if len(req.messages) > self.max_messages:
            raise ApiError(
                400, f"messages: {len(req.messages)} is more than this endpoint's {self.max_messages}", param="messages"
            )
        stops = req.stops()
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []] if req.tool_choice != "none" else []
        conv = conversation(req)
        with self.tok_lock:
            try:
                messages, schemas = template_messages(conv, tools, self.tokenizer, self.raw)
                ids = chat_ids(self.tokenizer, messages, tools=schemas)
            except Exception as e:  # the template refused the conversation (a role it does not know, ...)
                raise ApiError(400, f"messages: the chat template cannot render them: {e}", param="messages") from None
            start = forced_start(req.tool_choice, tools, self.tokenizer)
            ids += self.tokenizer.encode(start, add_special_tokens=False) if start else []
        params = self._sampling(req, len(ids), req.limit(), stops, "messages")
        version, outputs = self._generate([ids], params, session)
        with self.tok_lock:
            choices, chunks = [], []
            continues = session.continues(conv) if session else False
            for j, c in enumerate(outputs[0]):
                parts = pieces(self.tokenizer, c.token_ids) if (req.stream or req.logprobs) else []
                text = start + trimmed(
                    "".join(parts) if parts else self.tokenizer.decode(c.token_ids, skip_special_tokens=True), stops
                )
                content, api_calls, calls = reply(text, bool(tools))
                finish = "tool_calls" if calls else ("length" if c.finish_reason == "length" else "stop")
                message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
                if api_calls:
                    message["tool_calls"] = api_calls
                lp = None
                if req.logprobs:
                    lp = {
                        "content": [token_logprob(p, x) for p, x in zip(parts, c.logprobs, strict=True)],
                        "refusal": None,
                    }
                choices.append({"index": j, "message": message, "logprobs": lp, "finish_reason": finish})
                chunks += chat_chunks(j, content or "", start, parts, api_calls, lp, finish)
                said = reply_message(content or "", calls)
                self._remember(said, start + self.tokenizer.decode(c.token_ids, skip_special_tokens=True))
                if session is not None:
                    call = CapturedCall(
                        ids, list(c.token_ids), list(c.logprobs), version, req.temperature, c.finish_reason, continues
                    )
                    session.record(call, [*conv, said])
        usage = self._usage(len(ids), outputs)
        head = {"id": "chatcmpl-" + secrets.token_hex(12), "created": int(time.time()), "model": req.model}
        head["system_fingerprint"] = f"sarl-v{version}"
        response = {**head, "object": "chat.completion", "choices": choices, "usage": usage}
        stream = [{**head, "object": "chat.completion.chunk", **ch} for ch in chunks]
        if req.usage_in_stream():
            stream.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return response, stream

    def _generate(
        self, prompts: list[list[int]], params: SamplingParams, session: Session | None
    ) -> tuple[int, list[list[Completion]]]:
        """(version, completions); a session counts the time, the time without
        a generator, and a failure on this side (5xx: no generator, an engine
        error) as its own."""
        if session is not None and not session.ask():
            raise ApiError(
                429, f"this session has made its {session.max_calls} calls", "rate_limit_error", code="max_calls"
            )
        t0 = time.monotonic()
        try:
            out = self.backend.generate(prompts, params)
        except ApiError as e:
            if session is not None:
                session.served(time.monotonic() - t0, e.message if e.status >= 500 else "")
            raise
        if session is not None:
            session.served(time.monotonic() - t0, waited_s=out.waited_s)
        return out.version, out.outputs

    def _remember(self, said: dict[str, Any], text: str) -> None:
        """Keep the exact text of a reply that differs from its rendering, so
        that when it is sent back it renders as sampled (fewer re-tokenisation
        drifts). Bounded: the oldest go first."""
        key = json.dumps(said, sort_keys=True)
        if said.get("tool_calls") or said["content"] != text:
            self.raw[key] = text
            while len(self.raw) > 4096:
                self.raw.pop(next(iter(self.raw)))

    # ----------------------------------------------------------- completions
    def complete(self, req: CompletionRequest, session: Session | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        self.check_model(req.model)
        if req.n > self.max_n:
            raise ApiError(400, f"n: {req.n} is more than this endpoint's {self.max_n}", param="n")
        stops = req.stops()
        with self.tok_lock:
            prompts = self._prompts(req.prompt)
        if len(prompts) * req.n > self.max_n:
            raise ApiError(
                400, f"{len(prompts)} prompts x n {req.n} is more than this endpoint's {self.max_n}", param="prompt"
            )
        params = self._sampling(req, max(len(p) for p in prompts), req.max_tokens, stops, "prompt")
        version, outputs = self._generate(prompts, params, session)
        choices, chunks = [], []
        with self.tok_lock:
            for i, row in enumerate(outputs):
                for j, c in enumerate(row):
                    k = i * req.n + j
                    parts = pieces(self.tokenizer, c.token_ids) if (req.stream or req.logprobs is not None) else []
                    text = trimmed(
                        "".join(parts) if parts else self.tokenizer.decode(c.token_ids, skip_special_tokens=True), stops
                    )
                    finish = "length" if c.finish_reason == "length" else "stop"
                    lp = None
                    if req.logprobs is not None:
                        offsets = [sum(len(p) for p in parts[:m]) for m in range(len(parts))]
                        top = [{p: x} for p, x in zip(parts, c.logprobs, strict=True)] if req.logprobs else None
                        lp = {
                            "tokens": parts,
                            "token_logprobs": c.logprobs,
                            "top_logprobs": top,
                            "text_offset": offsets,
                        }
                    choices.append({"index": k, "text": text, "logprobs": lp, "finish_reason": finish})
                    chunks += [{"choices": [{"index": k, "text": text, "logprobs": lp, "finish_reason": finish}]}]
                    if session is not None:
                        session.record(
                            CapturedCall(
                                prompts[i],
                                list(c.token_ids),
                                list(c.logprobs),
                                version,
                                req.temperature,
                                c.finish_reason,
                            ),
                            None,
                        )
        usage = self._usage(sum(len(p) for p in prompts), outputs)
        head = {"id": "cmpl-" + secrets.token_hex(12), "object": "text_completion", "created": int(time.time())}
        head = {**head, "model": req.model, "system_fingerprint": f"sarl-v{version}"}
        stream = [{**head, **ch} for ch in chunks]
        if req.usage_in_stream():
            stream.append({**head, "choices": [], "usage": usage})
        return {**head, "choices": choices, "usage": usage}, stream

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            texts: list[Any] = [prompt]
        elif prompt and all(isinstance(t, int) for t in prompt):
            texts = [prompt]
        else:
            texts = list(prompt)
        if not texts:
            raise ApiError(400, "prompt: empty", param="prompt")
        out = []
        for i, t in enumerate(texts):
            ids = self.tokenizer.encode(t) if isinstance(t, str) else list(t)
            if not ids:
                raise ApiError(400, f"prompt[{i}]: no tokens", param="prompt")
            bad = next((x for x in ids if not 0 <= x < self.backend.vocab_size), None)
            if bad is not None:
                raise ApiError(
                    400, f"prompt[{i}]: {bad} is not a token id (0 <= id < {self.backend.vocab_size})", param="prompt"
                )
            out.append(ids)
        return out

    # ----------------------------------------------------------------- parts
    def _sampling(self, req: Any, prompt_len: int, limit: int | None, stops: list[str], what: str) -> SamplingParams:
        room = self.backend.max_model_len - prompt_len
        if room < 1 or (limit is not None and limit > room):
            asked = f"{prompt_len} + {limit} tokens to sample" if limit is not None else f"{prompt_len} tokens"
            raise ApiError(
                400,
                f"This model's maximum context length is {self.backend.max_model_len} tokens. However, you "
                f"requested {asked} ({what}): shorten them or lower max_tokens.",
                param=what,
                code="context_length_exceeded",
            )
        return SamplingParams(
            temperature=req.temperature, top_p=req.top_p, max_tokens=limit or room, stop=stops, seed=req.seed, n=req.n
        )

    def _usage(self, prompt_tokens: int, outputs: list[list[Any]]) -> dict[str, int]:
        sampled = sum(len(c.token_ids) for row in outputs for c in row)
        self.served += 1
        self.tokens += sampled
        return {"prompt_tokens": prompt_tokens, "completion_tokens": sampled, "total_tokens": prompt_tokens + sampled}

    def session_of(self, given: str, named: str | None) -> Session | None:
        """The session a request with bearer `given` is in; ApiError(401)
        for a wrong key, (404) for a session that is not open."""
        s = self.sessions.by_key(given) if self.sessions is not None and given else None
        if s is not None:
            if named is not None and named != s.id:
                raise ApiError(403, "this key belongs to another session", "permission_error")
            return s
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        if named is None:
            return None
        s = self.sessions.get(named) if self.sessions is not None else None
        if s is None:
            raise ApiError(404, f"no open session {named!r}", code="session_not_found")
        return s

    def health(self) -> dict[str, Any]:
        return {"version": self.backend.version(), "served": self.served, "tokens": self.tokens, "errors": self.errors}


def _handler(gw: Gateway) -> Any:
    class GatewayHandler(WholeRequestHandler):
        def _fail(self, e: ApiError) -> None:
            gw.errors += 1
            extra = {"Retry-After": "1"} if e.status == 503 else None
            if e.status == 401:
                extra = {"WWW-Authenticate": "Bearer"}
            self.reply_json(e.status, e.body(), extra)

        def _route(self) -> tuple[str, Session | None]:
            path, named = self.path.split("?", 1)[0], self.headers.get("X-Sarl-Session")
            m = _SESSION_PATH.match(path)
            if m:
                named, path = m.group(1), m.group(2)
            auth = self.headers.get("Authorization", "")
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            return path, gw.session_of(given, named)

        def do_GET(self) -> None:
            try:
                path, _ = self._route()
                if path == "/v1/models":
                    self.reply_json(200, {"object": "list", "data": gw.models()})
                elif path.startswith("/v1/models/"):
                    name = path[len("/v1/models/") :]
                    gw.check_model(name)
                    self.reply_json(200, next(m for m in gw.models() if m["id"] in (name, gw.model)))
                elif path == "/health":
                    self.reply_json(200, gw.health())
                else:
                    raise ApiError(404, f"no such path {path!r}: GET /v1/models, /health", code="unknown_url")
            except ApiError as e:
                self._fail(e)

        def do_POST(self) -> None:
            try:
                path, session = self._route()
                if path not in ("/v1/chat/completions", "/v1/completions"):
                    raise ApiError(
                        404, f"no such path {path!r}: POST /v1/chat/completions, /v1/completions", code="unknown_url"
                    )
                body = self.body()
                if body is None:
                    raise ApiError(411, "a Content-Length header (a number >= 0) is required")
                if path == "/v1/chat/completions":
                    req = parse(ChatRequest, body)
                    response, chunks = gw.chat(req, session)
                else:
                    req = parse(CompletionRequest, body)
                    response, chunks = gw.complete(req, session)
            except ApiError as e:
                self._fail(e)
                return
            except Exception as e:  # noqa: BLE001 (one request must never take the endpoint down)
                log.exception("request failed")
                self._fail(ApiError(500, f"{type(e).__name__}: {e}", "server_error"))
                return
            if req.stream:
                self._stream(chunks)
            else:
                self.reply_json(200, response)

        def _stream(self, chunks: Iterable[dict[str, Any]]) -> None:
            """Server-sent events, then `[DONE]`; the connection's end ends the body."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for c in chunks:
                self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

    return GatewayHandler
