"""Generation: the built-in model, the HF and vLLM engines, the generator
service (swaps, back-pressure, bad requests), the client, and the generator
role through the local executor and the real local Slurm."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import sarl, task_state, wait_for, write_config

from rl.engine import BadRequest
from rl.engine.config import HFEngineConfig, SamplingParams
from rl.generator.client import GeneratorClient, NoGenerator
from rl.generator.endpoint import read_endpoints, run_secret
from rl.generator.service import GeneratorServer
from rl.model import ModelConfig, chat_ids, checkpoint, load_tokenizer
from rl.store.weights import WeightStore

pytestmark = [pytest.mark.slow]

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the built-in model, converted once for the session."""
    cache = tmp_path_factory.mktemp("sarl-cache")
    checkpoint(ModelConfig(dtype="float32", cache_dir=cache))
    return cache


@pytest.fixture(scope="session")
def model(model_cache: Path) -> ModelConfig:
    return ModelConfig(dtype="float32", cache_dir=model_cache)


@pytest.fixture(scope="session")
def tok(model: ModelConfig) -> Any:
    return load_tokenizer(checkpoint(model))


@pytest.fixture(scope="session")
def hf(model: ModelConfig) -> Any:
    from rl.engine import make_engine

    return make_engine(HFEngineConfig(max_model_len=512), model)


def prompt(tok: Any, text: str) -> list[int]:
    return chat_ids(tok, [{"role": "user", "content": text}])


def perturbed(model: ModelConfig | Path, layer: int = 3, scale: float = 1.3) -> dict[str, Any]:
    """The base weights (of the built-in model, or of a checkpoint folder) with
    one layer scaled: a policy that answers differently."""
    from safetensors.torch import load_file

    folder = model if isinstance(model, Path) else checkpoint(model)
    sd = load_file(str(folder / "model.safetensors"))
    return {k: (v * scale if f"layers.{layer}." in k else v) for k, v in sd.items()}


def base(model: ModelConfig) -> dict[str, Any]:
    return perturbed(model, scale=1.0)


def two_versions(model: ModelConfig, folder: Path) -> tuple[str, WeightStore]:
    """A store holding the base weights as version 0 and a perturbed policy as 1."""
    store = str(folder / "store.zarr")
    ws = WeightStore(store)
    ws.publish(base(model), version=0, dtype="float32")
    ws.publish(perturbed(model), version=1, dtype="float32")
    return store, ws


def corrupt(ws: WeightStore, version: int, name: str = "model.layers.3.mlp.up_proj.weight") -> None:
    """Flip one bit of one tensor of a committed version, as a bad disk would."""
    e = ws.manifest(version)["tensors"][name]
    assert e["stored_in"] == version  # its bytes are this version's own, not shared with an older one
    with open(ws.path(version) / "data" / "c.0", "r+b") as f:
        f.seek(e["offset"] + 100)
        b = f.read(1)
        f.seek(e["offset"] + 100)
        f.write(bytes([b[0] ^ 1]))


# ------------------------------------------------------------------- model


def test_builtin_model_is_converted_once_into_a_checkpoint(model: ModelConfig, tok: Any) -> None:
    folder = checkpoint(model)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    t = time.monotonic()
    assert checkpoint(model) == folder  # cached: no second conversion
    assert time.monotonic() - t < 0.5
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    ids = prompt(tok, "Say hi.")
    text = tok.decode(ids)
    assert "Say hi." in text and text.endswith("<|im_start|>assistant\n")  # the generation prompt, applied once
    assert tok.decode(chat_ids(tok, [{"role": "user", "content": "Say hi."}], add_generation_prompt=False)) in text


def test_bad_model_and_engine_config_are_refused_before_submit(workdir: Path) -> None:
    for body, key in [
        ('[model]\npath = "/nonexistent/model"\n[generator]\n', "model.path"),
        ('[generator.engine]\ntype = "tgi"\n', "generator.engine.type"),
        ("[generator]\nport = 70000\n", "generator.port"),
    ]:
        cfg = write_config(workdir, f'[run]\nname = "g"\nroot = "runs"\n[executor]\ntype = "local"\n{body}')
        proc = sarl("submit", str(cfg), cwd=workdir, check=False)
        assert proc.returncode == 2, proc.stderr
        assert key in proc.stderr
        assert not (workdir / "runs" / "g").exists()


# ------------------------------------------------------------------ engines


def test_hf_engine_returns_sampled_tokens_with_their_logprobs(hf: Any, tok: Any) -> None:
    import torch

    p = prompt(tok, "What is 2+3?")
    [[c]] = hf.generate([p], SamplingParams(temperature=0, max_tokens=30))
    assert c.finish_reason == "stop" and c.token_ids[-1] in hf.eos  # ended on end of turn, which is kept
    assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
    # The log-probs are the model's, for exactly these tokens: recompute them by teacher forcing.
    with torch.no_grad():
        logits = hf.model(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1 : -1].float()
    again = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
    assert torch.allclose(again, torch.tensor(c.logprobs), atol=1e-4)

    [[short]] = hf.generate([p], SamplingParams(temperature=0, max_tokens=3))
    assert short.finish_reason == "length" and short.token_ids == c.token_ids[:3]

    code = prompt(tok, "Write a Python function that adds two numbers.")
    [[stopped]] = hf.generate([code], SamplingParams(temperature=0, max_tokens=40, stop=["\n"]))
    text = tok.decode(stopped.token_ids)
    assert stopped.finish_reason == "stop" and text.endswith("\n") and text.count("\n") == 1


def test_hf_engine_seeds_and_n_samples(hf: Any, tok: Any) -> None:
    p = prompt(tok, "Tell me a story.")
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=7, n=3)
    [a] = hf.generate([p], params)
    [b] = hf.generate([p], params)
    assert len(a) == 3
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    [c] = hf.generate([p], params.model_copy(update={"seed": 8}))
    assert [x.token_ids for x in c] != [x.token_ids for x in a]


# ------------------------------------------------------------------ service


TOKEN = "a-test-secret"


def _post(
    port: int, body: bytes | dict[str, Any], path: str = "/generate", token: str | None = TOKEN
) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(port: int, path: str = "/health", token: str | None = TOKEN) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_server_swaps_weights_between_batches_and_tags_each_response(
    hf: Any, tok: Any, model: ModelConfig, tmp_path: Path
) -> None:
    store, _ = two_versions(model, tmp_path)
    p = prompt(tok, "What is 2+3?")
    ref = {}
    for v in (1, 0):
        hf.load_version(store, v)
        ref[v] = hf.generate([p], GREEDY)[0][0].token_ids
    assert ref[0] != ref[1]

    server = GeneratorServer(hf, bind="127.0.0.1", token=TOKEN).start()
    seen: list[tuple[int, list[int]]] = []
    errors: list[Any] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            code, reply = _post(server.port, {"prompts": [p], "sampling": GREEDY.model_dump()})
            if code != 200:
                errors.append(reply)
                return
            seen.append((reply["version"], reply["outputs"][0][0]["token_ids"]))

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    try:
        for t in threads:
            t.start()
        for k in range(6):
            time.sleep(0.3)
            server.swap(store, (k + 1) % 2)
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join()
        server.stop()
    assert not errors
    assert {v for v, _ in seen} == {0, 1}
    wrong = [(v, toks) for v, toks in seen if toks != ref[v]]
    assert not wrong, f"{len(wrong)} of {len(seen)} responses were not produced by the version they name"


def test_a_corrupt_version_is_refused_and_the_engine_keeps_its_weights(
    hf: Any, tok: Any, model: ModelConfig, tmp_path: Path
) -> None:
    from rl.store import CorruptData, StoreError

    store, ws = two_versions(model, tmp_path)
    corrupt(ws, 1)
    p = prompt(tok, "What is 2+3?")
    hf.load_version(store, 0)
    before = hf.generate([p], GREEDY)[0][0].token_ids
    with pytest.raises(CorruptData, match="up_proj.weight: checksum mismatch"):
        hf.load_version(store, 1)
    assert hf.version == 0 and hf.generate([p], GREEDY)[0][0].token_ids == before
    ws.publish({"model.embed_tokens.weight": base(model)["model.embed_tokens.weight"][:10]}, version=2)
    with pytest.raises(StoreError, match="does not fit the model"):
        hf.load_version(store, 2)
    assert hf.version == 0 and hf.generate([p], GREEDY)[0][0].token_ids == before


def test_server_back_pressure_and_bad_requests(hf: Any, tok: Any, tmp_path: Path) -> None:
    p = prompt(tok, "Count to five.")
    server = GeneratorServer(hf, bind="127.0.0.1", max_queue=1, token=TOKEN).start()
    try:
        codes: list[int] = []
        body = {"prompts": [p], "sampling": {"temperature": 0, "max_tokens": 24}}
        threads = [threading.Thread(target=lambda: codes.append(_post(server.port, body)[0])) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 503 in codes and 200 in codes and set(codes) == {200, 503}

        bad: list[tuple[bytes | dict[str, Any], int, str]] = [
            (b"{not json", 400, "not JSON"),
            ({"prompts": [p], "temp": 0}, 400, "unknown field(s) ['temp']"),
            ({"prompts": [p], "sampling": {"top_p": 1.5}}, 400, "sampling.top_p"),
            ({"prompts": [p], "sampling": {"max_tokens": "many"}}, 400, "sampling.max_tokens"),
            ({"prompts": [[1, 2, 10**9]]}, 400, "prompts[0][2]"),
            ({"prompts": [[]]}, 400, "prompts[0]"),
            ({"prompts": "hello"}, 400, "prompts"),
            ({"prompts": [p * 40], "sampling": {"max_tokens": 16}}, 400, "exceeds max_model_len 512"),
            # values that pass a type check but that the engines cannot take (HF divided by a
            # temperature of 1e-300, rounded to 0 in float32, and answered 500)
            ({"prompts": [p], "sampling": {"temperature": 1e-300}}, 400, "sampling.temperature"),
            ({"prompts": [p], "sampling": {"temperature": 0.001}}, 400, "sampling.temperature"),
            ({"prompts": [p], "sampling": {"temperature": 1e9}}, 400, "sampling.temperature"),
            ({"prompts": [p], "sampling": {"temperature": float("nan")}}, 400, "sampling.temperature"),
            ({"prompts": [p], "sampling": {"top_p": 1e-300}}, 400, "sampling.top_p"),
            ({"prompts": [p], "sampling": {"seed": 2**64}}, 400, "sampling.seed"),
            ({"prompts": [p], "sampling": {"seed": -1}}, 400, "sampling.seed"),
            ({"prompts": [p], "sampling": {"stop": ["\ud800"]}}, 400, "sampling.stop"),
            ({"prompts": [p], "sampling": {"stop": ["x"] * 17}}, 400, "sampling.stop"),
            ({"prompts": [p], "sampling": {"stop_token_ids": [10**6]}}, 400, "sampling.stop_token_ids[0]"),
            ({"prompts": [p], "sampling": {"n": 10**6}}, 400, "sampling.n"),
        ]
        for req, code, words in bad:
            got, reply = _post(server.port, req)
            assert got == code and words in reply["error"], (req, got, reply)
        assert _post(server.port, body)[0] == 200  # and it serves on
        assert _post(server.port, {}, path="/v1/completions")[0] == 404
        health = _get(server.port)[1]
        assert health["backend"] == "hf" and health["queued"] == 0 and health["served"] >= codes.count(200)
    finally:
        server.stop()


def test_client_raises_bad_request_without_retrying(hf: Any, tmp_path: Path) -> None:
    server = GeneratorServer(hf, bind="127.0.0.1", token=run_secret(tmp_path)).start()
    try:
        (tmp_path / "endpoints").mkdir()
        announce = {"task": 0, "addr": "127.0.0.1", "port": server.port, "version": 0, "queued": 0}
        (tmp_path / "endpoints" / "generator-000000.json").write_text(json.dumps({**announce, "at": time.time()}))
        client = GeneratorClient(tmp_path)
        with pytest.raises(BadRequest, match=r"prompts\[0\]\[0\]"):
            client.generate([[-5]], {"max_tokens": 4})
        assert server.health()["served"] == 0
    finally:
        server.stop()


def test_requests_without_the_run_secret_are_refused(hf: Any, tok: Any) -> None:
    server = GeneratorServer(hf, bind="127.0.0.1", token=TOKEN).start()
    try:
        body = {"prompts": [prompt(tok, "Hi")], "sampling": {"max_tokens": 2}}
        for token in (None, "wrong", TOKEN + "x"):
            assert _post(server.port, body, token=token)[0] == 401
            assert _get(server.port, token=token)[0] == 401
        assert _post(server.port, body)[0] == 200 and server.health()["served"] == 1
    finally:
        server.stop()


def test_the_run_secret_is_created_once_and_readable_by_its_owner_only(tmp_path: Path) -> None:
    tokens: list[str] = []
    threads = [threading.Thread(target=lambda: tokens.append(run_secret(tmp_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(tokens)) == 1 and len(tokens[0]) == 64
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]


def _raw(port: int, data: bytes, timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(data)
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = c.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def test_one_client_cannot_hold_the_generator(hf: Any, tok: Any) -> None:
    p = prompt(tok, "Hi")
    server = GeneratorServer(hf, bind="127.0.0.1", token=TOKEN, max_batch=4, io_timeout_s=1.0, max_connections=16)
    server.start()
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    try:
        bad: list[tuple[dict[str, Any], str]] = [
            ({"prompts": [p] * 3, "sampling": {"n": 2}}, "exceeds this generator's max_batch 4"),
            ({"prompts": [p], "sampling": {"stop": ["x" * 100, "y" * 100]}}, "sampling.stop"),
            ({"prompts": [p], "sampling": {"stop": ["z" * 1000]}}, "sampling.stop"),
            ({"prompts": [p], "sampling": {"seed": 2**63}}, "sampling.seed"),
            ({"prompts": [p], "sampling": {"stop_token_ids": [2**63]}}, "sampling.stop_token_ids"),
        ]
        for req, words in bad:
            code, reply = _post(server.port, req)
            assert code == 400 and words in reply["error"], (req, code, reply)
        deep = b"[" * 200_000 + b"]" * 200_000
        assert _post(server.port, deep) == (400, {"error": "body is nested too deeply"})
        head = _raw(server.port, b"POST /generate HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: -1\r\n\r\n{}")
        assert head.startswith(b"HTTP/1.1 411")

        # half-sent requests: dropped after io_timeout_s, so they hold no thread for long
        hanging = []
        for _ in range(40):
            c = socket.create_connection(("127.0.0.1", server.port))
            c.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 100\r\n\r\n{")
            hanging.append(c)
        time.sleep(2.5)
        threads = threading.active_count()
        for c in hanging:
            c.close()
        assert threads < 40, threads
        assert _post(server.port, {"prompts": [p], "sampling": {"max_tokens": 2}})[0] == 200

        # a burst of 200 connections: each is answered (200 or 503), none reset
        codes: list[int | str] = []

        def one() -> None:
            try:
                codes.append(_post(server.port, {"prompts": [p], "sampling": {"max_tokens": 2}})[0])
            except OSError as e:
                codes.append(type(e).__name__)

        burst = [threading.Thread(target=one) for _ in range(200)]
        for t in burst:
            t.start()
        for t in burst:
            t.join()
        assert set(codes) <= {200, 503} and 200 in codes, sorted(set(map(str, codes)))
    finally:
        server.stop()


def test_slow_clients_hold_no_thread_are_cut_at_the_deadline_and_do_not_starve_fast_ones(hf: Any, tok: Any) -> None:
    """A slowloris: clients that send a byte every 0.3 s, well within any
    per-read timeout, four times more of them than the connections the
    generator answers at once. A request must arrive whole within
    `io_timeout_s` (1 s here): each is answered 408 and closed by then. While
    they trickle, a fast client is served, and the slow ones hold no
    thread."""
    p = prompt(tok, "Hi")
    server = GeneratorServer(hf, bind="127.0.0.1", token=TOKEN, io_timeout_s=1.0, max_connections=16).start()
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
    slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(64)]
    stop = threading.Event()

    def trickle() -> None:
        for i in range(40):
            for c in slow:
                with contextlib.suppress(OSError):
                    c.send(head[i : i + 1])
            if stop.wait(0.3):
                return

    before = threading.active_count()
    t = threading.Thread(target=trickle)
    t.start()
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= 2  # the trickler (and at most one request) only
        code, reply = _post(server.port, {"prompts": [p], "sampling": {"max_tokens": 2}})
        assert code == 200, reply
        time.sleep(2.0)  # past the deadline, still trickling
        answers = []
        for c in slow:
            c.settimeout(2.0)
            try:
                answers.append(c.recv(4096))
            except OSError as e:  # reset: closed with bytes unread
                answers.append(type(e).__name__.encode())
        cut = [a for a in answers if a.startswith(b"HTTP/1.1 408") or a in (b"", b"ConnectionResetError")]
        assert len(cut) == len(slow), answers[:3]
        assert server.intake.counts.timed_out + server.intake.counts.evicted >= len(slow)
    finally:
        stop.set()
        t.join()
        for c in slow:
            c.close()
        server.stop()


def test_a_server_error_does_not_take_a_live_generator_out(hf: Any, tok: Any, tmp_path: Path) -> None:
    """A generator that answers 500 is alive: the client tries elsewhere but
    does not mark it dead, and says what the generator answered."""
    server = GeneratorServer(hf, bind="127.0.0.1", token=run_secret(tmp_path)).start()
    try:
        (tmp_path / "endpoints").mkdir()
        announce = {"task": 0, "addr": "127.0.0.1", "port": server.port, "version": 0, "queued": 0}
        (tmp_path / "endpoints" / "generator-000000.json").write_text(json.dumps({**announce, "at": time.time()}))
        client = GeneratorClient(tmp_path, attempts=2)
        broken = server.engine.generate
        server.engine.generate = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUDA error"))  # type: ignore[method-assign]
        with pytest.raises(NoGenerator, match="HTTP 500: engine error: RuntimeError: CUDA error"):
            client.generate([prompt(tok, "Hi")], {"max_tokens": 2})
        server.engine.generate = broken  # type: ignore[method-assign]
        assert client.endpoints() and not client.dead_until
        assert client.generate([prompt(tok, "Hi")], {"max_tokens": 2}).version == 0
    finally:
        server.stop()


# ------------------------------------------------------------------- roles


def _generator_config(cache: Path, backend: str, tasks: int, executor: str, extra: str = "") -> str:
    """`cache`: the built-in model's cache, or a checkpoint folder (the tiny model)."""
    model = f'path = "{cache}"' if (cache / "config.json").exists() else f'cache_dir = "{cache}"'
    return f"""
[run]
name = "g"
root = "runs"

[run.recovery]
enabled = false  # a test of the manual path (sarl resume); tests/test_recovery.py turns it on
[executor]
type = "{executor}"

[model]
dtype = "float32"
{model}

[generator]
tasks = {tasks}
poll_s = 0.5

[generator.engine]
type = "{backend}"
max_model_len = 1024
{extra}
"""


def _tb_scalars(folder: Path, version: int) -> dict[str, list[float]] | None:
    """The generator's TensorBoard scalars, once its curve shows `version`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    out = {t: [e.value for e in acc.Scalars(t)] for t in tags}
    return out if version in out.get("generator/version", []) else None


def _wait_endpoints(run_dir: Path, n: int, timeout: float, version: int | None = None) -> list[Any]:
    def ready() -> list[Any] | None:
        eps = read_endpoints(run_dir, stale_s=10, now=time.time())
        ok = len(eps) == n and (version is None or all(e.version == version for e in eps))
        return eps if ok else None

    return wait_for(ready, timeout, f"{n} generator(s) announcing version {version}")


def test_generator_role_local_reloads_weights_and_survives_a_killed_generator(
    workdir: Path, tiny_model: Path, tok: Any
) -> None:
    # the tiny model: the subject is swaps and a dead generator, not the answers
    cfg = write_config(workdir, _generator_config(tiny_model, "hf", 2, "local"))
    sarl("submit", str(cfg), cwd=workdir)
    run_dir = workdir / "runs" / "g"
    try:
        eps = _wait_endpoints(run_dir, 2, 300)
        client = GeneratorClient(run_dir, timeout_s=60)
        p = prompt(tok, "What is 2+3?")
        before = client.generate([p], GREEDY)
        assert before.version == 0

        WeightStore(run_dir / "store.zarr").publish(
            perturbed(tiny_model, layer=1, scale=3.0), version=1, dtype="float32"
        )
        _wait_endpoints(run_dir, 2, 60, version=1)
        after = client.generate([p], GREEDY)
        assert after.version == 1
        assert after.outputs[0][0].token_ids != before.outputs[0][0].token_ids
        assert [s["version"] for s in task_state(run_dir, 0, "generator")["swaps"]] == [1]

        def curves() -> list[dict[str, list[float]]] | None:  # both prompts drawn, wherever they were served
            both = [_tb_scalars(run_dir / "tb" / f"generator-{t:06d}", 1) for t in (0, 1)]
            drawn = [c for c in both if c is not None]
            ok = len(drawn) == 2 and sum(max(c["generator/prompts_served"]) for c in drawn) == 2
            return drawn if ok else None

        both = wait_for(curves, 60, "curves of both generators")
        assert max(max(c.get("generator/tokens_per_s", [0])) for c in both) > 0
        assert max(max(c.get("generator/engine_tokens_per_s", [0])) for c in both) > 0
        assert [len(c["generator/swap_held_s"]) for c in both] == [1, 1]

        out = sarl("generate", str(run_dir), "What is 2+3?", "--max-tokens", "12", "--json", cwd=workdir)
        reply = json.loads(out.stdout)
        assert reply["version"] == 1 and reply["token_ids"] == after.outputs[0][0].token_ids and reply["text"]

        # one whole episode with the agent and environment rollouts use (a workspace, with tools)
        from rl.tasks.format import write_tasks
        from rl.tasks.workspaces import workspace_tasks

        write_tasks(workdir / "ws.jsonl", workspace_tasks()[:1])
        task = f"{workdir / 'ws.jsonl'}:{workspace_tasks()[0].task_id}"
        out = sarl("generate", str(run_dir), "--task", task, "--max-tokens", "16", "--json", cwd=workdir)
        ep = json.loads(out.stdout)
        assert ep["version"] == 1 and 1 <= ep["turns"] <= 3 and ep["end"] in ("max-turns", "submitted", "token-budget")
        assert len(ep["token_ids"]) == len(ep["loss_mask"]) and 0 < sum(ep["loss_mask"]) <= 16 * ep["turns"]
        assert "read_file" in ep["transcript"] and ep["tool_calls"] >= ep["turns"]  # the tools were offered
        assert 0.0 <= ep["reward"] <= 1.0
        both_ways = sarl("generate", str(run_dir), "hi", "--task", task, cwd=workdir, check=False)
        assert both_ways.returncode == 2 and "one of them" in both_ways.stderr

        victim = next(e for e in eps if e.task == 0)
        pid = json.loads((run_dir / "endpoints" / "generator-000000.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        fresh = GeneratorClient(run_dir, timeout_s=60)
        assert len(fresh.endpoints()) == 2  # its announcement is still fresh: only trying tells it is dead
        served_by = [fresh.generate([p], GREEDY).endpoint.task for _ in range(4)]
        assert served_by == [1, 1, 1, 1]
        assert fresh.failures[victim.key] == 1  # tried once, then left out

        sarl("cancel", str(run_dir), cwd=workdir)
        gone = sarl("generate", str(run_dir), "hi", "--wait", "1", cwd=workdir, check=False)
        assert gone.returncode == 1 and "no generator served the request" in gone.stderr
    finally:
        sarl("cancel", str(run_dir), cwd=workdir, check=False)


def test_a_stopped_generator_is_given_up_once_its_announcements_fall_silent(
    workdir: Path, tiny_model: Path, tok: Any
) -> None:
    """SIGSTOP keeps a generator's connections open and answers nothing. Its
    announcements (from a thread of their own, every 0.5 s) fall silent, and
    a client waiting on it retries elsewhere after about 5 s, not after its
    `timeout_s` (120 s here), nor after recovery has killed the process."""
    cfg = write_config(workdir, _generator_config(tiny_model, "hf", 2, "local"))
    sarl("submit", str(cfg), cwd=workdir)
    run_dir = workdir / "runs" / "g"
    pid = 0
    try:
        eps = _wait_endpoints(run_dir, 2, 300)
        victim = next(e for e in eps if e.task == 0)
        pid = json.loads((run_dir / "endpoints" / "generator-000000.json").read_text())["pid"]
        os.kill(pid, signal.SIGSTOP)
        client = GeneratorClient(run_dir, timeout_s=120)
        p = prompt(tok, "What is 2+3?")
        took, served_by = [], []
        for _ in range(3):  # round robin: the stopped one is tried within the first two
            t0 = time.monotonic()
            served_by.append(client.generate([p], GREEDY).endpoint.task)
            took.append(time.monotonic() - t0)
        assert served_by == [1, 1, 1]
        assert client.failures[victim.key] == 1  # tried once, given up, then left out
        assert max(took) < 20, took  # silent after 5 s, plus a second's look and the answer
        assert max(took) > 4, took  # it did wait on the stopped one, for about its silence
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)
        sarl("cancel", str(run_dir), cwd=workdir, check=False)


def _health(ep: Any, run_dir: Path) -> dict[str, Any]:
    """The generator's own account of its queue and engine (GET /health)."""
    req = urllib.request.Request(
        f"http://{ep.addr}:{ep.port}/health", headers={"Authorization": f"Bearer {run_secret(run_dir)}"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        health: dict[str, Any] = json.loads(r.read())
    return health


@pytest.mark.slurm
def test_generator_role_on_slurm_serves_with_vllm_and_reloads(
    workdir: Path, slurm: None, model_cache: Path, model: ModelConfig, tok: Any
) -> None:
    job = "[generator.job]\ncpus_per_task = 2\nmem_gb = 6\n"
    engine = "kv_cache_gb = 0.5\n"
    cfg = write_config(workdir, _generator_config(model_cache, "vllm", 1, "slurm", engine + job))
    out = sarl("submit", str(cfg), cwd=workdir)
    assert out.stdout.startswith("Submitted generator job ")
    run_dir = workdir / "runs" / "g"
    try:
        [ep] = _wait_endpoints(run_dir, 1, 300)
        assert ep.version == 0
        client = GeneratorClient(run_dir, timeout_s=120)
        p = prompt(tok, "What is 2+3?")
        before = client.generate([p, p], GREEDY)
        assert before.version == 0 and before.outputs[0][0].token_ids == before.outputs[1][0].token_ids

        # Continuous batching: a short request sent while a long one decodes is answered first.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its result, or what it raised, comes back
            long = pool.submit(client.generate, [p], {"max_tokens": 200, "ignore_eos": True})
            wait_for(lambda: _health(ep, run_dir)["busy"], 60, "the long request to be admitted into the engine")
            assert not long.done()
            short = client.generate([p], GREEDY)
            assert short.outputs[0][0].token_ids == before.outputs[0][0].token_ids
            assert not long.done()
            assert len(long.result().outputs[0][0].token_ids) == 200

        # Requests keep coming while version 1 is loaded: each response is all one version's.
        seen: list[tuple[int, list[int]]] = []
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                r = client.generate([p], GREEDY)
                seen.append((r.version, r.outputs[0][0].token_ids))

        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: seen, 30, "responses from version 0")
        WeightStore(run_dir / "store.zarr").publish(perturbed(model), version=1, dtype="float32")
        _wait_endpoints(run_dir, 1, 120, version=1)
        wait_for(lambda: sum(v == 1 for v, _ in seen) >= 3, 30, "responses from version 1")
        stop.set()
        for t in threads:
            t.join()
        after = client.generate([p], GREEDY)
        assert after.version == 1
        assert after.outputs[0][0].token_ids != before.outputs[0][0].token_ids
        ref = {0: before.outputs[0][0].token_ids, 1: after.outputs[0][0].token_ids}
        assert {v for v, _ in seen} == {0, 1} and all(toks == ref[v] for v, toks in seen)
        st = json.loads(sarl("status", str(run_dir), "--json", cwd=workdir).stdout)
        assert "serving version 1" in json.dumps(st)

        ws = WeightStore(run_dir / "store.zarr")  # a version corrupted on disk is refused; version 1 serves on
        staging = WeightStore(run_dir / "staging")  # corrupted before the generator can see it
        staging.publish(perturbed(model, layer=7), version=2, dtype="float32")
        corrupt(staging, 2)
        staging.path(2).rename(ws.path(2))  # committed as published: the rename is the commit
        refused = wait_for(lambda: task_state(run_dir, 0, "generator").get("refused"), 60, "version 2 refused")
        assert "checksum mismatch" in refused["2"]
        again = client.generate([p], GREEDY)
        assert again.version == 1 and again.outputs[0][0].token_ids == after.outputs[0][0].token_ids
    finally:
        sarl("cancel", str(run_dir), cwd=workdir, check=False)


def test_bench_generate_reports_each_figure_beside_its_baseline_and_the_backends_agree(workdir: Path) -> None:
    # float32: this CPU decodes bf16 batches 2-3x slower (docs/benchmarks.md); the figures' meaning is the same
    proc = sarl("bench", "generate", "--quick", "--dtype", "float32", "--json", cwd=workdir, timeout=600)
    r = json.loads(proc.stdout)
    for key in ("vllm_tok_s_b8", "hf_tok_s_b8", "vllm_tok_s_b1", "hf_tok_s_b1", "reload_s", "safetensors_load_s"):
        assert r[key] > 0, key
    assert r["speedup_b8"] == pytest.approx(r["vllm_tok_s_b8"] / r["hf_tok_s_b8"], rel=0.01)
    assert r["reload_ratio"] == pytest.approx(r["reload_s"] / r["safetensors_load_s"], rel=0.01)
    assert r["weights_mb"] > 500  # SmolLM2-135M in float32: the real model's weights were reloaded
    # Same fp32 weights and prompts, greedy: the two backends sample the same tokens, and their
    # log-probs differ by at most 1e-3 (kernels differ; 2e-5 was measured)
    assert r["greedy_same_rows"] == r["greedy_rows"] == 8
    assert 0 <= r["greedy_max_logprob_diff"] <= 1e-3


@pytest.mark.slurm
def test_preempted_generator_comes_back_serving_the_newest_version(
    workdir: Path, slurm: None, tiny_model: Path, tok: Any
) -> None:
    job = "[generator.job]\ncpus_per_task = 8\nmem_gb = 4\ntime_min = 30\n"  # fills the node: preemptable
    cfg = write_config(workdir, _generator_config(tiny_model, "hf", 1, "slurm", job))
    sarl("submit", str(cfg), cwd=workdir)
    run_dir = workdir / "runs" / "g"
    try:
        _wait_endpoints(run_dir, 1, 180)
        WeightStore(run_dir / "store.zarr").publish(perturbed(tiny_model, layer=1), version=1, dtype="float32")
        _wait_endpoints(run_dir, 1, 60, version=1)
        announce = run_dir / "endpoints" / "generator-000000.json"
        pid = json.loads(announce.read_text())["pid"]
        subprocess.run(
            ["sbatch", "-p", "urgent", "-c", "8", "-o", "/dev/null", "--wrap", "sleep 3"],
            check=True,
            capture_output=True,
            cwd=workdir,
        )

        def back() -> bool:  # the announcement goes when the generator is preempted, and comes back
            d = json.loads(announce.read_text()) if announce.exists() else {}
            return d.get("pid", pid) != pid and d["version"] == 1

        wait_for(back, 180, "the requeued generator to announce version 1")
        state = task_state(run_dir, 0, "generator")
        assert len(state["starts"]) == 2 and state["checkpoints"] >= 1
        reply = GeneratorClient(run_dir, timeout_s=60).generate([prompt(tok, "What is 2+3?")], GREEDY)
        assert reply.version == 1  # restarted from the base checkpoint, it loaded the newest version first
    finally:
        sarl("cancel", str(run_dir), cwd=workdir, check=False)


def test_vllm_serves_64_concurrent_seeded_sampled_requests_and_its_log_probs_are_of_the_tempered_policy(
    model: ModelConfig, tok: Any, tmp_path: Path
) -> None:
    """64 requests arrive at once, sampled at temperature 0.8 with seeds,
    their prompts about 130 tokens each: more new tokens than one vLLM step
    takes (1,024 here, `step_tokens`). vLLM split prompts over steps, and its CPU backend then
    failed to rewind a seeded sequence's generator ("CPU Generator does not
    use offset"): the engine died at the first such burst. The service
    admits sequences so that no prompt is split and none is preempted: every
    request is answered, and the same seeds give the same tokens again. The
    log-probs vLLM records are of the distribution sampled from (logits /
    temperature): the trainer's at the same temperature match them."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl.engine import make_engine
    from rl.engine.config import VLLMEngineConfig
    from rl.generator.inprocess import serving
    from rl.learner.trainer import token_logprobs

    # a small step makes a burst of short prompts overflow it: the same path as 8,192 tokens
    # of long prompts, for a third of the compute
    cfg = VLLMEngineConfig(max_model_len=512, step_tokens=1024, kv_cache_gb=1.0, max_num_seqs=64)
    engine = make_engine(cfg, model)
    assert engine.step_tokens == 1024
    text = " ".join(f"item{i}" for i in range(50))
    prompts = [prompt(tok, f"Sort these, case {k}: {text}") for k in range(64)]
    assert sum(map(len, prompts)) > 8 * engine.step_tokens
    params = {"temperature": 0.8, "max_tokens": 16, "ignore_eos": True}
    try:
        with serving(engine, tmp_path):
            client = GeneratorClient(tmp_path, max_inflight=64, timeout_s=600)
            results: dict[int, Any] = {}
            errors: list[BaseException] = []

            def one(k: int) -> None:
                try:
                    results[k] = client.generate([prompts[k]], {**params, "seed": 1000 + k})
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)

            threads = [threading.Thread(target=one, args=(k,)) for k in range(64)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors[:3]
            assert len(results) == 64
            group = client.generate([prompts[0]], {**params, "seed": 7, "n": 4})  # a group in one request
            again = client.generate([prompts[3]], {**params, "seed": 1003})
        assert again.outputs[0][0].token_ids == results[3].outputs[0][0].token_ids  # seeded: reproducible
        assert len(group.outputs[0]) == 4 and len({tuple(c.token_ids) for c in group.outputs[0]}) > 1
        # the engine itself handed a whole burst at once, nothing in front of it: twice the prompt
        # tokens its step takes, each prompt prefilled whole in some step, none split (a split
        # seeded prompt killed the engine at the first step)
        from rl.engine.config import SamplingParams

        burst = prompts[:20]
        assert sum(map(len, burst)) > 1.9 * engine.step_tokens
        for k, p in enumerate(burst):
            engine.add(f"burst-{k}", p, SamplingParams(temperature=0.8, max_tokens=4, seed=k, ignore_eos=True))
        finished: set[str] = set()
        for _ in range(500):
            finished |= {rid for rid, _ in engine.step()}
            if len(finished) == len(burst):
                break
        assert len(finished) == len(burst)
    finally:
        engine.close()
    hf = AutoModelForCausalLM.from_pretrained(checkpoint(model), dtype=torch.float32)
    c = results[5].outputs[0][0]
    ids = torch.tensor([prompts[5] + c.token_ids])
    mask = torch.tensor([[0.0] * len(prompts[5]) + [1.0] * len(c.token_ids)])
    with torch.no_grad():
        mine = token_logprobs(hf, ids, torch.ones_like(ids), mask, temperature=0.8)[0][mask[:, 1:] > 0]
    assert torch.allclose(mine, torch.tensor(c.logprobs), atol=2e-3), (mine - torch.tensor(c.logprobs)).abs().max()
