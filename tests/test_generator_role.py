"""The generator role through the local executor and the real local Slurm:
weights reloaded as versions are published, a killed, stopped or preempted
generator, its curves."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import merged, run_config, sarl, task_state, wait_for, write_config
from generation_weights import GREEDY, corrupt, perturbed, prompt

from rl.model import ModelConfig
from rl.serving.announcements import read_endpoints, run_secret
from rl.serving.client import GeneratorClient
from rl.store.weights import WeightStore

pytestmark = [pytest.mark.slow]


def _generator_config(
    cache: Path, backend: str, workers: int, executor: str, generator: dict[str, Any] | None = None
) -> str:
    """`cache`: the built-in model's cache, or a checkpoint folder (the tiny
    model); `generator`: keys over the generator section's."""
    model = {"path": cache} if (cache / "config.json").exists() else {"cache_dir": cache}
    base = {"workers": workers, "poll_s": 0.5, "engine": {"type": backend, "max_model_len": 1024}}
    return run_config(
        "g",
        recovery=False,  # a test of the manual path (sarl resume); tests/test_recovery.py turns it on
        executor={"type": executor},
        model={"dtype": "float32", **model},
        generator=merged(base, generator or {}),
    )


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
    generator = {"engine": {"kv_cache_gb": 0.5}, "job": {"cpus_per_task": 2, "mem_gb": 6}}
    cfg = write_config(workdir, _generator_config(model_cache, "vllm", 1, "slurm", generator))
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


@pytest.mark.slurm
def test_preempted_generator_comes_back_serving_the_newest_version(
    workdir: Path, slurm: None, tiny_model: Path, tok: Any
) -> None:
    job = {"cpus_per_task": 8, "mem_gb": 4, "time_min": 30}  # fills the node: preemptable
    cfg = write_config(workdir, _generator_config(tiny_model, "hf", 1, "slurm", {"job": job}))
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
