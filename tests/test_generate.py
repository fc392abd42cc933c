"""Generation: the built-in model, the HF and vLLM engines, the generator
service (swaps, back-pressure, bad requests) and the client. The generator
role is in test_generator_role.py."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import run_config, sarl, write_config
from generation_weights import GREEDY, base, corrupt, prompt, two_versions

from rl.engine import BadRequest
from rl.engine.config import SamplingParams
from rl.model import ModelConfig, chat_ids, checkpoint
from rl.serving.announcements import run_secret
from rl.serving.client import GeneratorClient, NoGenerator
from rl.serving.service import GeneratorServer

pytestmark = [pytest.mark.slow]


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
    for sections, key in [
        ({"model": {"path": "/nonexistent/model"}, "generator": {}}, "model.path"),
        ({"generator": {"engine": {"type": "tgi"}}}, "generator.engine.type"),
        ({"generator": {"port": 70000}}, "generator.port"),
    ]:
        cfg = write_config(workdir, run_config("g", executor={"type": "local"}, **sections))
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


def test_bench_generate_reports_each_figure_beside_its_baseline_and_the_backends_agree(workdir: Path) -> None:
    # float32: this CPU decodes bf16 batches 2-3x slower (docs/benchmarks.md); the figures' meaning is the same
    proc = sarl("bench", "generate", "--quick", "--dtype", "float32", "--json", cwd=workdir, timeout=600)
    r = json.loads(proc.stdout)
    for key in ("vllm_tok_s_b8", "hf_tok_s_b8", "vllm_tok_s_b1", "hf_tok_s_b1", "reload_s", "safetensors_load_s"):
        assert r[key] > 0, key
    assert r["speedup_b8"] == pytest.approx(r["vllm_tok_s_b8"] / r["hf_tok_s_b8"], rel=0.01)
    assert r["reload_ratio"] == pytest.approx(r["reload_s"] / r["safetensors_load_s"], rel=0.01)
    assert r["weights_mb"] > 500  # SmolLM2-135M in float32: the real model's weights were reloaded
    assert r["vllm_core"] == "in-process"  # on CPU, by default
    # Same fp32 weights and prompts, greedy: the two backends sample the same tokens, and their
    # log-probs differ by at most 1e-3 (kernels differ; 2e-5 was measured)
    assert r["greedy_same_rows"] == r["greedy_rows"] == 8
    assert 0 <= r["greedy_max_logprob_diff"] <= 1e-3


def _host_state() -> tuple[object, ...]:
    """What an engine built in this process must leave as it was: the
    processes under it, torch's thread setter, the RNGs, the garbage
    collector's frozen heap, vLLM's reading of the environment."""
    import gc
    import random

    import psutil
    import torch
    import vllm.envs

    rngs = (random.getstate(), torch.get_rng_state().tolist())
    kids = sorted(c.pid for c in psutil.Process().children(recursive=True))
    return kids, torch.set_num_threads, rngs, gc.get_freeze_count(), vllm.envs._is_envs_cache_enabled()


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
    from rl.learner.logprobs import token_logprobs
    from rl.serving.inprocess import serving

    # a small step makes a burst of short prompts overflow it: the same path as 8,192 tokens
    # of long prompts, for a third of the compute
    cfg = VLLMEngineConfig(max_model_len=512, step_tokens=1024, kv_cache_gb=1.0, max_num_seqs=64)
    host = _host_state()
    engine = make_engine(cfg, model)
    # on CPU the engine core runs in this process: nothing spawned, and this process's state as it was
    assert engine.in_process and _host_state() == host, (host, _host_state())
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


_ENGINE_THEN_SLEEP = """
import sys, time
from pathlib import Path
from rl.engine import make_engine
from rl.engine.config import VLLMEngineConfig
from rl.model import ModelConfig
engine = make_engine(VLLMEngineConfig(max_model_len=256, kv_cache_gb=0.25, max_num_seqs=4, engine_core="own-process"),
                     ModelConfig(dtype="float32", cache_dir=Path(sys.argv[1])))
print("ready", flush=True)
time.sleep(3600)
"""


def test_the_vllm_engine_core_ends_when_the_process_that_built_it_is_killed(model: ModelConfig) -> None:
    """With `engine_core = "own-process"` (the default on GPUs), vLLM runs
    its engine core in a child process. Killed with SIGKILL
    (by hand, or by the OOM killer), the process that built the LLM used to
    leave that child running, holding its memory and cores, on a local run
    with nothing to reap it. The engine core now watches its parent and
    ends with it."""
    import subprocess
    import sys

    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-c", _ENGINE_THEN_SLEEP, str(model.cache_dir)], stdout=subprocess.PIPE, text=True
    )
    children: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        assert "ready" in (line.strip() for line in proc.stdout), "the engine did not start"  # vLLM logs here too
        children = psutil.Process(proc.pid).children(recursive=True)
        cores = [c for c in children if "EngineCore" in " ".join(c.cmdline()) + c.name()]
        assert cores, [(c.name(), c.cmdline()) for c in children]
        proc.kill()
        proc.wait()
        _, alive = psutil.wait_procs(cores, timeout=120)
        assert not alive, f"the engine core outlived its parent: {alive}"
    finally:
        proc.kill()
        for c in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                c.kill()
