"""The OpenAI-compatible endpoint (rl.gateway), driven by the official
`openai` client against a real engine: the tiny model on the HF engine,
and SmolLM2 where a reply must make sense (a tool call). Exact token
capture is checked against the engine itself: a seeded request sampled
again over the native protocol gives the ids the session recorded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from rl.engine.config import SamplingParams

KEY = "sk-test-key"


class Live:
    def __init__(self, model: Path | None, max_model_len: int = 512, **gateway: Any):
        from rl.engine import make_engine
        from rl.engine.config import HFEngineConfig
        from rl.gateway.backends import ServiceBackend
        from rl.gateway.capture import Sessions
        from rl.gateway.server import Gateway
        from rl.model import ModelConfig, checkpoint, load_tokenizer
        from rl.serving.service import GeneratorServer

        cfg = ModelConfig(path=str(model), dtype="float32") if model else ModelConfig(dtype="float32")
        self.engine = make_engine(HFEngineConfig(max_model_len=max_model_len), cfg)
        self.server = GeneratorServer(self.engine, bind="127.0.0.1", token="native", max_batch=16).start()
        self.tokenizer = load_tokenizer(checkpoint(cfg))
        self.sessions = Sessions()
        self.backend = ServiceBackend(self.server)
        self.gateway = Gateway(
            self.backend, self.tokenizer, model="m", token=KEY, sessions=self.sessions, **gateway
        ).start()
        self.client = openai.OpenAI(base_url=self.gateway.url, api_key=KEY, max_retries=0, timeout=120)

    def close(self) -> None:
        self.gateway.stop()
        self.server.stop()


@pytest.fixture(scope="module")
def live(tiny_model: Path) -> Iterator[Live]:
    lv = Live(tiny_model, max_messages=64, io_timeout_s=2.0, max_body=1 << 20)
    yield lv
    lv.close()


HI = [{"role": "user", "content": "hi"}]


def _raw(
    live: Live, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", live.gateway.port, timeout=30)
    conn.request(method, path, body, {"Authorization": f"Bearer {KEY}", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data) if data.startswith(b"{") else data


def test_the_official_client_lists_the_live_version_and_chats(live: Live) -> None:
    ids = [m.id for m in live.client.models.list().data]
    assert ids == ["m", f"m@v{live.engine.version}"]
    r = live.client.chat.completions.create(model="m@v0", messages=HI, max_tokens=6, temperature=0, logprobs=True)
    c = r.choices[0]
    assert r.object == "chat.completion" and r.system_fingerprint == "sarl-v0" and c.message.role == "assistant"
    assert r.usage.completion_tokens == 6 and c.finish_reason == "length"
    assert len(c.logprobs.content) == 6 and all(x.logprob <= 0 for x in c.logprobs.content)
    assert "".join(x.token for x in c.logprobs.content) == c.message.content
    from rl.model import chat_ids

    assert r.usage.prompt_tokens == len(chat_ids(live.tokenizer, HI))  # rendered by the rollouts' one template


def test_a_stream_gives_the_whole_answer_chunk_by_chunk(live: Live) -> None:
    whole = live.client.chat.completions.create(model="m", messages=HI, max_tokens=8, temperature=0)
    chunks = list(
        live.client.chat.completions.create(
            model="m", messages=HI, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"] and chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []


def test_n_seed_stop_and_the_completions_route(live: Live) -> None:
    a = live.client.chat.completions.create(model="m", messages=HI, max_tokens=5, n=3, seed=7, temperature=1.0)
    b = live.client.chat.completions.create(model="m", messages=HI, max_tokens=5, n=3, seed=7, temperature=1.0)
    assert len(a.choices) == 3 and [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    # the tiny model's greedy reply is newlines: a stop string ends it, and is not in the text
    free = live.client.chat.completions.create(model="m", messages=HI, max_tokens=6, temperature=0)
    assert "\n" in free.choices[0].message.content and free.choices[0].finish_reason == "length"
    cut = live.client.chat.completions.create(model="m", messages=HI, max_tokens=6, temperature=0, stop=["\n"])
    assert cut.choices[0].finish_reason == "stop" and "\n" not in cut.choices[0].message.content
    t = live.client.completions.create(model="m", prompt="def add(a, b):", max_tokens=4, temperature=0, logprobs=1)
    assert t.object == "text_completion" and t.usage.completion_tokens == 4
    assert "".join(t.choices[0].logprobs.tokens) == t.choices[0].text
    ids = live.tokenizer.encode("def add(a, b):")
    by_ids = live.client.completions.create(model="m", prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == t.choices[0].text
    two = live.client.completions.create(model="m", prompt=["a", "b"], max_tokens=2, n=2, temperature=0)
    assert [c.index for c in two.choices] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "change, status, param, code",
    [
        ({"model": "gpt-4o"}, 404, "model", "model_not_found"),
        ({"model": "m@v9"}, 404, "model", "model_not_found"),
        ({"extra_body": {"frobnicate": 1}}, 400, "frobnicate", None),
        ({"max_tokens": 10**9}, 400, "messages", "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": "word " * 600}]}, 400, "messages", "context_length_exceeded"),
        ({"n": 10_000}, 400, "n", None),
        ({"max_tokens": 0}, 400, "max_tokens", None),
        ({"temperature": -1}, 400, "temperature", None),
        ({"temperature": 0.001}, 400, "temperature", None),
        ({"top_p": 1e-9}, 400, "top_p", None),
        ({"messages": [{"role": "user", "content": "x"}] * 65}, 400, "messages", None),
        ({"messages": []}, 400, "messages", None),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role", None),
        ({"extra_body": {"top_logprobs": 5}}, 400, "top_logprobs", None),
        ({"presence_penalty": 1.0}, 400, "presence_penalty", None),
        ({"stop": ["x" * 100, "y" * 100]}, 400, "stop", None),
    ],
)
def test_bad_requests_get_the_api_error_shape(
    live: Live, change: dict[str, Any], status: int, param: str, code: str | None
) -> None:
    kw: dict[str, Any] = {"model": "m", "messages": HI, "max_tokens": 4, **change}
    with pytest.raises(openai.APIStatusError) as e:
        live.client.chat.completions.create(**kw)
    assert e.value.status_code == status
    err = e.value.body
    assert isinstance(err, dict) and err["param"] == param and err["code"] == code and err["message"]
    assert err["type"] == "invalid_request_error"
    assert live.client.chat.completions.create(model="m", messages=HI, max_tokens=1).usage.completion_tokens == 1


def test_a_wrong_key_bad_json_and_unknown_paths_are_refused_cleanly(live: Live) -> None:
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=live.gateway.url, api_key="wrong", max_retries=0).models.list()
    assert e.value.body["code"] == "invalid_api_key"
    status, body = _raw(live, "POST", "/v1/chat/completions", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = _raw(live, "POST", "/v1/chat/completions", b"[1, 2]")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = _raw(live, "POST", "/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status in (400, 413) and "error" in body
    status, body = _raw(live, "POST", "/v1/embeddings", b"{}")
    assert status == 404 and body["error"]["code"] == "unknown_url"
    status, _ = _raw(live, "GET", "/v1/models", headers={"Authorization": "Basic abc"})
    assert status == 401


def test_slow_and_huge_clients_do_not_keep_others_out(live: Live) -> None:
    """A slowloris (a byte a second) is answered 408 after `io_timeout_s`
    (2 s here), a body over `max_body` 413, both in the API's shape; a
    client that comes meanwhile is served."""
    slow = socket.create_connection(("127.0.0.1", live.gateway.port))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n"
    stop = threading.Event()

    def trickle() -> None:
        for b in head:
            if stop.wait(0.5):
                return
            try:
                slow.send(bytes([b]))
            except OSError:
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    r = live.client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    assert r.usage.completion_tokens == 2
    slow.settimeout(30)
    answer = slow.recv(4096)
    stop.set()
    assert answer.startswith(b"HTTP/1.1 408") and b'"invalid_request_error"' in answer
    big = socket.create_connection(("127.0.0.1", live.gateway.port))  # its body would be 2 MiB: refused at its head
    big.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n".encode())
    big.sendall(f"Content-Type: application/json\r\nContent-Length: {2 << 20}\r\n\r\n".encode())
    big.settimeout(30)
    answer = big.recv(4096)
    big.close()
    assert answer.startswith(b"HTTP/1.1 413") and b'"message": "request too large"' in answer
    assert live.client.chat.completions.create(model="m", messages=HI, max_tokens=2).usage.completion_tokens == 2


def test_a_session_records_exactly_the_ids_the_engine_sampled(live: Live) -> None:
    """An agent loop with the official client, keyed to one session (an
    episode), three turns with tools offered: every recorded call holds the
    prompt ids that the chat template gives its messages, and the ids and
    log-probs that the engine samples for them (sampled again over the
    native protocol with the same seed); the assembled samples train on
    exactly those ids, and count each call whose rendering did not extend
    them."""
    from rl.gateway.api import ChatRequest
    from rl.gateway.render import conversation, template_messages
    from rl.model import chat_ids

    session = live.sessions.open("episode-1")
    agent = openai.OpenAI(base_url=live.gateway.url, api_key=session.key, max_retries=0)
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object", "properties": {}}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "count to three"}]
    for turn in range(3):
        r = agent.chat.completions.create(
            model="m", messages=messages, tools=tools, max_tokens=10, temperature=1.0, seed=turn
        )
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"go on ({turn})"})
    assert len(session.calls) == 3
    for turn, call in enumerate(session.calls):
        sent = messages[: 1 + 2 * turn]
        req = ChatRequest.model_validate({"model": "m", "messages": sent, "tools": tools})
        rendered, schemas = template_messages(
            conversation(req),
            [t.model_dump(exclude_none=True) for t in req.tools or []],
            live.tokenizer,
            live.gateway.raw,
        )
        assert call.prompt_ids == chat_ids(live.tokenizer, rendered, tools=schemas)
        again = live.backend.generate([call.prompt_ids], SamplingParams(temperature=1.0, max_tokens=10, seed=turn))
        assert call.sampled_ids == again.outputs[0][0].token_ids and call.version == again.version == 0
        assert call.logprobs == pytest.approx(again.outputs[0][0].logprobs, abs=1e-5)
        assert call.continues == (turn > 0)
    got = session.assembled()
    trained = [t for s in got.samples for t, m in zip(s.tokens, s.loss_mask, strict=True) if m]
    assert trained == [t for c in session.calls for t in c.sampled_ids]
    assert sum(1 for s in got.samples for v in s.versions if v == 0) == len(trained)
    extend = sum(
        1
        for a, b in zip(session.calls, session.calls[1:], strict=False)
        if b.prompt_ids[: len(a.prompt_ids) + len(a.sampled_ids)] != a.prompt_ids + a.sampled_ids
    )
    assert got.mismatches == extend and len(got.samples) == 1 + extend
    # the session's key is its own: another session's path is refused, a closed session's key too
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=live.gateway.url.replace("/v1", "/s/other/v1"), api_key=session.key).models.list()
    live.sessions.close("episode-1")
    with pytest.raises(openai.AuthenticationError):
        agent.models.list()
    with pytest.raises(openai.NotFoundError):  # the endpoint's key naming a session that is not open
        openai.OpenAI(base_url=live.gateway.url.replace("/v1", "/s/episode-1/v1"), api_key=KEY).models.list()


def test_a_drifted_rendering_starts_a_sample_of_its_own_with_the_sampled_ids(tiny_model: Path) -> None:
    """Sampled `hel` + `lo` re-tokenises as `hello`: the next call's prompt
    does not extend what was sampled. The sampled ids stay as sampled, in a
    sample of their own, and the drift is counted; a call that extends its
    predecessor joins its sample."""
    from rl.gateway.capture import CapturedCall, assemble
    from rl.model import load_tokenizer

    tok = load_tokenizer(tiny_model)
    pieces = [tok.convert_tokens_to_ids(t) for t in ("hel", "lo")]
    whole = tok.encode("hello", add_special_tokens=False)
    assert pieces != whole and tok.decode(pieces) == tok.decode(whole)
    p1 = [1, 2, 3]
    calls = [
        CapturedCall(p1, pieces, [-0.1, -0.2], 4, 1.0, "stop"),
        CapturedCall(p1 + whole + [5, 6], [7], [-0.3], 5, 1.0, "stop", continues=True),  # drifted
        CapturedCall(p1 + whole + [5, 6, 7, 8], [9], [-0.4], 5, 1.0, "stop", continues=True),  # extends the second
    ]
    got = assemble(calls)
    assert got.mismatches == 1 and len(got.samples) == 2
    first, second = got.samples
    assert first.tokens == p1 + pieces and first.loss_mask == [0, 0, 0, 1, 1] and first.versions[-2:] == [4, 4]
    assert second.tokens == p1 + whole + [5, 6, 7, 8, 9]
    assert [t for t, m in zip(second.tokens, second.loss_mask, strict=True) if m] == [7, 9]
    assert second.logprobs[-1] == -0.4 and second.logprobs[len(p1 + whole) + 2] == -0.3


@pytest.fixture(scope="module")
def smol() -> Iterator[Live]:
    lv = Live(None, max_model_len=1024)
    yield lv
    lv.close()


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
ASK = 'Reply with exactly: <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.mark.slow  # 20 s alone: out of the fast tier
def test_smollm2_calls_a_tool_through_the_official_client_and_reads_its_result(smol: Live) -> None:
    messages: list[Any] = [{"role": "user", "content": ASK}]
    r = smol.client.chat.completions.create(model="m", messages=messages, tools=WEATHER, max_tokens=60, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    streamed = list(
        smol.client.chat.completions.create(
            model="m", messages=messages, tools=WEATHER, max_tokens=60, temperature=0, stream=True
        )
    )
    deltas = [d for ch in streamed for d in ch.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas] == ["get_weather"] and streamed[-1].choices[
        0
    ].finish_reason == "tool_calls"
    messages += [c.message, {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    after = smol.client.chat.completions.create(
        model="m", messages=messages, tools=WEATHER, max_tokens=8, temperature=0
    )
    assert after.usage.prompt_tokens > r.usage.prompt_tokens + 10  # the call and its result are in the prompt
    none = smol.client.chat.completions.create(
        model="m", messages=messages[:1], tools=WEATHER, tool_choice="none", max_tokens=60, temperature=0
    )
    assert none.choices[0].message.tool_calls is None  # no tools offered, none read


@pytest.mark.slow  # 12 s alone: out of the fast tier
def test_tool_choice_required_or_named_makes_the_reply_a_call_and_the_opening_is_not_trained(smol: Live) -> None:
    """A question that SmolLM2 answers in prose under `auto` is answered with
    a call under `required` and under a named function: the call's opening is
    fed as the end of the prompt, so it is recorded there (loss_mask 0), and
    the sampled ids are the model's alone."""
    question = [{"role": "user", "content": "Say hello to me in French."}]
    auto = smol.client.chat.completions.create(
        model="m", messages=question, tools=WEATHER, max_tokens=30, temperature=0
    )
    assert auto.choices[0].message.tool_calls is None  # the baseline: no call of its own accord
    session = smol.sessions.open("forced")
    agent = openai.OpenAI(base_url=smol.gateway.url, api_key=session.key, max_retries=0)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        r = agent.chat.completions.create(
            model="m", messages=question, tools=WEATHER, tool_choice=choice, max_tokens=30, temperature=0
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c.message
        assert [t.function.name for t in c.message.tool_calls] == ["get_weather"]
        json.loads(c.message.tool_calls[0].function.arguments)
    smol.sessions.close("forced")
    opening = smol.tokenizer.encode('<tool_call>{"name": "get_weather", "arguments": ', add_special_tokens=False)
    call = session.calls[1]
    assert call.prompt_ids[-len(opening) :] == opening  # fed, not sampled
    assert call.sampled_ids[: len(opening)] != opening
    sample = [t for t in session.assembled().samples if t.tokens == call.prompt_ids + call.sampled_ids]
    assert sample and all(t.loss_mask == [0] * len(call.prompt_ids) + [1] * len(call.sampled_ids) for t in sample)
    streamed = list(
        smol.client.chat.completions.create(
            model="m", messages=question, tools=WEATHER, tool_choice=named, max_tokens=30, temperature=0, stream=True
        )
    )
    deltas = [d for ch in streamed for d in ch.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas] == ["get_weather"]
    # among several tools, "required" opens a call and the model names the tool
    two = [*WEATHER, {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    m = (
        smol.client.chat.completions.create(
            model="m", messages=question, tools=two, tool_choice="required", max_tokens=30, temperature=0
        )
        .choices[0]
        .message
    )
    assert m.tool_calls or (m.content or "").startswith("<tool_call>"), m
    for choice, why in (({"type": "function", "function": {"name": "nope"}}, "no tool named"), ("required", "tools")):
        with pytest.raises(openai.BadRequestError) as e:
            smol.client.chat.completions.create(
                model="m", messages=question, tools=None if choice == "required" else WEATHER, tool_choice=choice
            )
        assert e.value.body["param"] == "tool_choice" and why in e.value.body["message"]


def _serve(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        cwd=Path(__file__).parents[1],
    )


def test_sarl_serve_an_exported_folder_with_a_key_it_prints(tiny_model: Path) -> None:
    """Without SARL_API_KEY, `sarl serve` makes a key and prints it; only that
    key is taken. (With SARL_API_KEY set, that one is the key: `api_key`.)"""
    from rl.run.serve import api_key

    os.environ["SARL_API_KEY"] = "sk-mine"
    try:
        assert api_key() == ("sk-mine", False)
    finally:
        del os.environ["SARL_API_KEY"]
    made, generated = api_key()
    assert generated and made.startswith("sk-sarl-") and len(made) > 30 and api_key()[0] != made
    p = _serve([str(tiny_model), "--engine", "hf", "--port", "0", "--name", "tiny"], {"SARL_API_KEY": ""})
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("serving tiny (weight version 0) at http://127.0.0.1:"), line
        url = line.split(" at ")[1].strip()
        key_line = p.stdout.readline()
        assert key_line.startswith("key (SARL_API_KEY was not set): sk-sarl-")
        key = key_line.rsplit(" ", 1)[1].strip()
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny", "tiny@v0"]
        assert client.chat.completions.create(model="tiny", messages=HI, max_tokens=3).usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="sk-other", max_retries=0).models.list()
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0


def test_sarl_serve_refuses_what_it_cannot_serve(tmp_path: Path, tiny_model: Path) -> None:
    for args, says in [
        ([str(tmp_path)], "neither a run directory"),
        ([str(tiny_model), "--version", "3"], "--version"),
        ([str(tiny_model), "--port", "70000"], "--port 70000"),
    ]:
        p = _serve(args, {})
        _, err = p.communicate(timeout=120)
        assert p.returncode != 0 and says in err, err


@pytest.mark.slow
def test_bench_endpoint_measures_each_way_beside_the_native_protocol(tiny_model: Path) -> None:
    bench = ["bench", "endpoint", "--quick", "--engine", "hf", "--model", str(tiny_model), "--json"]
    p = subprocess.run(
        [sys.executable, "-m", "jobs.cli", *bench],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=Path(__file__).parents[1],
    )
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout)
    for c in ("c1", "c16"):
        assert set(got[c]) == {"native", "openai_serve", "openai_run"}
        assert all(w["tokens_per_s"] > 0 and w["requests_per_s"] > 0 for w in got[c].values())
    native = got["c16"]["native"]["tokens_per_s"]
    assert got["ratio_c16"]["serve"] == pytest.approx(got["c16"]["openai_serve"]["tokens_per_s"] / native, abs=1e-3)


def test_each_sampled_id_adds_its_text_and_together_they_are_the_reply(tiny_model: Path) -> None:
    """Stream chunks and log-prob tokens come from `pieces`: a character
    split over several ids (emoji, CJK) comes whole with the id that ends it."""
    from rl.gateway.render import pieces
    from rl.model import load_tokenizer

    tok = load_tokenizer(tiny_model)
    text = "héllo wörld 日本語 🙂  def f(x):\n    return x  # ok"
    ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    got = pieces(tok, ids)
    assert len(got) == len(ids) and "".join(got) == text and got[-1] == ""
    assert "\ufffd" not in "".join(got) and any(p == "" for p in got[:-1])  # a split character waits for its end
