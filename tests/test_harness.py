"""Harness episodes (rl.rollout.harness): an agent program of the user's,
written against the official `openai` package, plays each episode in its
sandbox through the rollout worker's OpenAI endpoint. On real components:
bubblewrap sandboxes, the HF engine on the tiny model, the generator
service and client, the verifier, the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_config

REPO = Path(__file__).parents[1]
AGENT = REPO / "examples" / "harness" / "react_agent.py"


def _workspace_tasks(n: int) -> list[Any]:
    from rl.tasks.workspaces import workspace_tasks

    return workspace_tasks()[:n]


def test_a_harness_episode_stores_exactly_the_ids_the_engine_sampled(tmp_path: Path, tiny_model: Path) -> None:
    """The example ReAct agent plays 2 groups of 2 workspace tasks through a
    real rollout worker. Every episode is committed once; each call's
    sampled ids and log-probs in the store are those the engine gives its
    prompt with the call's seed (sampled again over the native protocol)."""
    from conftest import hf_worker

    from rl.engine import make_engine
    from rl.engine.config import SamplingParams
    from rl.rollout.generation import episode_seed
    from rl.rollout.loop import play
    from rl.serving.client import GeneratorClient
    from rl.serving.inprocess import serving
    from rl.tasks.format import write_tasks

    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks(tasks_file, _workspace_tasks(2))
    rollout = {
        "groups": 2, "group_size": 2, "concurrency": 4, "max_retries": 0,
        "agent": {"max_turns": 2, "max_tokens": 8, "temperature": 1.0,
                  "harness": {"command": ["python3", "react_agent.py"], "files": {"react_agent.py": str(AGENT)}}},
    }  # fmt: skip
    sandbox = {"runtime": "venv", "packages": ["openai"]}
    worker, cfg, _ = hf_worker(tmp_path, "harness", tasks_file, tiny_model, rollout, sandbox=sandbox)
    engine = make_engine(cfg.generator.engine, cfg.model)
    try:
        with serving(engine, cfg.run_dir):
            summary = play(worker)
            reader = worker.store.reader()
            samples = [s for k in reader.committed() for s in reader.read(k).samples()]
            assert sorted(s.episode_id for s in samples) == ["0/0", "0/1", "1/0", "1/1"], summary
            client = GeneratorClient(cfg.run_dir)
            for s in samples:
                group, i = map(int, s.episode_id.split("/"))
                runs = _sampled_runs(s.loss_mask)
                assert runs, f"episode {s.episode_id} made no call: {s.failure}"
                for turn, (a, b) in enumerate(runs):
                    seed = episode_seed(cfg.run.seed, group, i) + turn
                    params = SamplingParams(temperature=1.0, max_tokens=8, seed=seed)
                    again = client.generate([s.tokens[:a].tolist()], params).outputs[0][0]
                    assert s.tokens[a:b].tolist() == again.token_ids[: b - a], (s.episode_id, turn)
                    assert s.logprobs[a:b].tolist() == pytest.approx(again.logprobs[: b - a], abs=1e-4)
                assert s.retokenized == 0 and s.failure in ("wrong-answer", "no-code", "crash", "")
    finally:
        engine.close()


def _state(run: Path, role: str) -> dict:
    from conftest import task_state

    try:
        return task_state(run, 0, role)
    except (FileNotFoundError, ValueError):  # not written yet
        return {}


def _sampled_runs(mask: Any) -> list[tuple[int, int]]:
    """The [start, end) of each run of 1s: one per call."""
    out, start = [], None
    for k, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            out.append((start, k))
            start = None
    return out


PROBE = """
import json, os, socket, sys
from openai import OpenAI

got = {}
r = OpenAI().chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=3, seed=1)
got["endpoint"] = r.usage.completion_tokens
for name, port in (("generator", int(sys.argv[1])), ("elsewhere", 80)):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        got[name] = "reached"
    except OSError as e:
        got[name] = type(e).__name__
try:
    OpenAI(api_key="sk-guess").models.list()
    got["other key"] = "accepted"
except Exception as e:
    got["other key"] = type(e).__name__
try:  # its second call: one more than max_calls
    again = [{"role": "user", "content": "again"}]
    OpenAI(max_retries=0).chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=again, max_tokens=3)
    got["second call"] = "answered"
except Exception as e:
    got["second call"] = type(e).__name__
print(json.dumps(got), file=sys.stderr)
"""


def test_a_harness_program_reaches_its_endpoint_with_its_own_key_and_nothing_else(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Inside the sandbox the endpoint answers the episode's key; the
    generator that serves it (on the same host) is not reachable, nor any
    other port, and a made-up key is refused. The episode's one call is its
    one sample; a closed session's key is refused afterwards."""
    from rl.agent.config import AgentConfig
    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig
    from rl.gateway.backends import ClientBackend
    from rl.gateway.capture import Sessions
    from rl.gateway.server import Gateway
    from rl.model import ModelConfig, load_tokenizer
    from rl.rollout.harness import run_harness
    from rl.serving.client import GeneratorClient
    from rl.serving.inprocess import serving
    from rl.verify.config import VerifyConfig
    from rl.verify.verifier import Verifier
    from sandboxes.bwrap import BwrapSandbox
    from sandboxes.config import SandboxConfig

    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    engine = make_engine(HFEngineConfig(max_model_len=512), ModelConfig(path=str(tiny_model), dtype="float32"))
    tok = load_tokenizer(tiny_model)
    try:
        with serving(engine, tmp_path) as server:
            client = GeneratorClient(tmp_path)
            with Gateway(
                ClientBackend(client, 512, len(tok)), tok, model="policy", token="x", sessions=Sessions()
            ) as gw:
                gw.start()
                agent = AgentConfig.model_validate(
                    {
                        "harness": {
                            "command": ["python3", "probe.py", str(server.port)],
                            "files": {"probe.py": probe},
                            "max_calls": 1,
                        }
                    }  # fmt: skip
                )
                box = SandboxConfig(runtime="venv", packages=["openai"], network=[f"127.0.0.1:{gw.port}"])
                task = _workspace_tasks(1)[0]
                with BwrapSandbox(box) as sb, Verifier(VerifyConfig()) as verifier:
                    ep = run_harness(task, agent, gw, tok, sb, verifier, None, 7, "0/0")
    finally:
        engine.close()
    out = ep.outcomes[0]
    assert out["exit_code"] == 0, out
    got = json.loads(out["stderr"].strip().splitlines()[-1])
    assert got == {"endpoint": 3, "generator": "ConnectionRefusedError", "elsewhere": "ConnectionRefusedError",
                   "other key": "AuthenticationError", "second call": "RateLimitError"}  # fmt: skip
    assert ep.end == "exited" and ep.turns == 1 and ep.more == []
    assert sum(ep.trajectory.loss_mask) == 3 and ep.verdict is not None and not ep.verdict.passed
    assert gw.sessions.by_key("x") is None and not gw.sessions._open  # the episode's session is closed


SLOW = """
import json, os, sys, time, urllib.request
body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                             {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
urllib.request.urlopen(req, timeout=300).read()
print("answered", file=sys.stderr, flush=True)
time.sleep(1000)
"""


@pytest.mark.slow  # 33 s alone: out of the fast tier
def test_a_program_cut_by_its_deadline_after_waiting_for_a_generator_is_retried_not_scored(
    tmp_path: Path, tiny_model: Path
) -> None:
    """A program's wall-time limit cannot move by the time its calls wait for
    a generator (a native episode's deadline does). A program whose one call
    waited ~4 s for a generator to appear, then ran into its deadline, is an
    infrastructure failure (EndpointFailed: retried, never scored); the same
    program with a generator there from the start is the policy's `deadline`."""
    import threading
    import time

    from rl.agent.config import AgentConfig
    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig
    from rl.gateway.backends import ClientBackend
    from rl.gateway.capture import Sessions
    from rl.gateway.server import Gateway
    from rl.model import ModelConfig, load_tokenizer
    from rl.rollout.harness import EndpointFailed, run_harness
    from rl.serving.client import GeneratorClient
    from rl.serving.inprocess import serving
    from rl.verify.config import VerifyConfig
    from rl.verify.verifier import Verifier
    from sandboxes.bwrap import BwrapSandbox
    from sandboxes.config import SandboxConfig

    program = tmp_path / "slow.py"
    program.write_text(SLOW)
    engine = make_engine(HFEngineConfig(max_model_len=512), ModelConfig(path=str(tiny_model), dtype="float32"))
    tok = load_tokenizer(tiny_model)
    agent = AgentConfig.model_validate({"harness": {"command": ["python3", "slow.py"], "files": {"slow.py": program}}})
    task = _workspace_tasks(1)[0]

    def play(folder: Path, late: bool) -> Any:
        folder.mkdir()
        client = GeneratorClient(folder, wait_for_generator_s=120)
        with Gateway(ClientBackend(client, 512, len(tok)), tok, model="policy", token="x", sessions=Sessions()) as gw:
            gw.start()
            box = SandboxConfig(network=[f"127.0.0.1:{gw.port}"])
            with BwrapSandbox(box) as sb, Verifier(VerifyConfig()) as verifier:
                out: dict[str, Any] = {}

                def episode() -> None:
                    try:
                        out["ep"] = run_harness(task, agent, gw, tok, sb, verifier, time.monotonic() + 15, 1, "0/0")
                    except EndpointFailed as e:
                        out["failed"] = str(e)

                thread = threading.Thread(target=episode)
                thread.start()
                if late:
                    time.sleep(4.0)
                with serving(engine, folder):
                    thread.join(120)
                assert not thread.is_alive()
                return out

    try:
        control = play(tmp_path / "present", late=False)
        late = play(tmp_path / "late", late=True)
    finally:
        engine.close()
    ep = control["ep"]
    assert ep.end == "deadline" and ep.turns == 1 and "answered" in ep.outcomes[0]["stderr"], ep.outcomes
    assert "waited" in late.get("failed", ""), late


def _run_config(tasks_file: Path, tiny_model: Path, groups: int, learner: bool, recovery: bool = False) -> str:
    learn = {
        "steps": 1,
        "samples_per_step": 4,
        "micro_batches": 2,
        "poll_s": 0.2,
        "job": {"mem_gb": 6},
        "optimizer": {"lr": 1e-3},
    }
    return run_config(
        "h",
        run={"max_staleness": 1000, "seed": 3},
        recovery={"enabled": recovery, "check_s": 2, "beat_s": 1},
        executor={"type": "local"},
        model={"path": tiny_model, "dtype": "float32"},
        sandbox={"runtime": "venv", "packages": ["openai"]},
        generator={"poll_s": 0.5, "engine": {"type": "hf", "max_model_len": 1024, "threads": 1}},
        rollout={
            "tasks_file": tasks_file,
            "groups": groups,
            "group_size": 2,
            "concurrency": 2,
            "batch_groups": 1,
            "groups_per_step": 2,
            "agent": {
                "max_turns": 2,
                "max_tokens": 8,
                "temperature": 1.0,
                "harness": {"command": ["python3", "react_agent.py"], "files": {"react_agent.py": AGENT}},
            },
        },
        learner=learn if learner else None,
    )


@pytest.mark.slow
@pytest.mark.slurm
def test_a_harness_run_on_slurm_trains_the_learner_on_the_sampled_ids(
    workdir: Path, tiny_model: Path, slurm: None
) -> None:
    """Generator, rollout worker (the example agent in its sandbox, through
    the endpoint), verifier, store and a learner step, as Slurm jobs. The
    learner trains on the committed samples; each call's sampled ids and
    log-probs are those the engine gives its prompt and seed (the tiny model
    at version 0, one thread, as the generator ran it)."""
    from conftest import sarl, task_state, wait_for, write_config

    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig, SamplingParams
    from rl.model import ModelConfig
    from rl.rollout.generation import episode_seed
    from rl.store import Store
    from rl.tasks.format import write_tasks

    tasks_file = workdir / "tasks.jsonl"
    write_tasks(tasks_file, _workspace_tasks(2))
    cfg = write_config(workdir, _run_config(tasks_file, tiny_model, groups=2, learner=True))
    sarl("submit", str(cfg), "--cluster", "slurm", cwd=workdir)
    run = workdir / "runs" / "h"
    try:
        wait_for(lambda: _state(run, "learner").get("done"), 900, "the learner's step")
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
    learner = task_state(run, 0, "learner")
    assert learner["result"]["step"] == 1 and learner["result"]["batches"] == 2, learner
    store = Store(run / "store.zarr")
    assert store.weights.latest() == 1
    reader = store.reader()
    samples = [s for k in reader.committed() for s in reader.read(k).samples()]
    assert sorted(s.episode_id for s in samples) == ["0/0", "0/1", "1/0", "1/1"]
    engine = make_engine(
        HFEngineConfig(max_model_len=1024, threads=1), ModelConfig(path=str(tiny_model), dtype="float32")
    )
    try:
        for s in samples:
            group, i = map(int, s.episode_id.split("/"))
            runs = _sampled_runs(s.loss_mask)
            assert runs and set(s.versions[s.loss_mask == 1]) == {0}
            for turn, (a, b) in enumerate(runs):
                params = SamplingParams(temperature=1.0, max_tokens=8, seed=episode_seed(3, group, i) + turn)
                again = engine.generate([s.tokens[:a].tolist()], params)[0][0]
                assert s.tokens[a:b].tolist() == again.token_ids[: b - a], (s.episode_id, turn)
                assert s.logprobs[a:b].tolist() == pytest.approx(again.logprobs[: b - a], abs=1e-4)
    finally:
        engine.close()
    _serve_the_run(run)


def _serve_the_run(run: Path) -> None:
    """`sarl serve RUN_DIR --version N` serves a published version of the
    trained run under the OpenAI API; a version it has not published is refused."""
    import os
    import signal
    import subprocess
    import sys

    import openai

    argv = [sys.executable, "-m", "jobs.cli", "serve", str(run), "--engine", "hf", "--port", "0"]
    env = {**os.environ, "SARL_API_KEY": "sk-run"}
    bad = subprocess.run([*argv, "--version", "9"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and "--version 9" in bad.stderr and "versions 0 to 1" in bad.stderr, bad.stderr
    p = subprocess.Popen([*argv, "--version", "1"], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("serving h (weight version 1) at "), line
        client = openai.OpenAI(base_url=line.split(" at ")[1].strip(), api_key="sk-run", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["h", "h@v1"]
        r = client.chat.completions.create(model="h@v1", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.system_fingerprint == "sarl-v1" and r.usage.completion_tokens == 2
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0


@pytest.mark.slow
def test_a_harness_worker_killed_mid_episode_commits_each_episode_once(workdir: Path, tiny_model: Path) -> None:
    """The worker is SIGKILLed while its programs wait on the endpoint (the
    generator stopped); recovery starts it again, and every episode is
    committed exactly once: those in flight were never committed, and are
    played again with new keys."""
    import os
    import signal
    import time

    from conftest import sarl, task_state, wait_for, write_config

    from rl.store import Store
    from rl.tasks.format import write_tasks

    tasks_file = workdir / "tasks.jsonl"
    write_tasks(tasks_file, _workspace_tasks(4))
    cfg = write_config(workdir, _run_config(tasks_file, tiny_model, groups=4, learner=False, recovery=True))
    sarl("submit", str(cfg), cwd=workdir)
    run = workdir / "runs" / "h"
    store = Store(run / "store.zarr")

    def beat(role: str) -> dict:
        try:
            return json.loads((run / "heartbeats" / role / "task-000000.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    try:
        wait_for(lambda: len(store.reader().committed()) >= 1, 600, "a first batch")
        generator = beat("generator")["pid"]
        os.kill(generator, signal.SIGSTOP)  # the programs in flight now wait on the endpoint
        try:
            wait_for(lambda: beat("rollout").get("inflight", 0) >= 1, 60, "episodes in flight")
            before = len(store.reader().committed())
            os.kill(beat("rollout")["pid"], signal.SIGKILL)
            time.sleep(1.0)
        finally:
            os.kill(generator, signal.SIGCONT)
        wait_for(lambda: _state(run, "rollout").get("done"), 900, "the restarted worker to finish")
    finally:
        sarl("cancel", str(run), cwd=workdir, check=False)
    state = task_state(run, 0, "rollout")
    assert len(state["starts"]) == 2, state["starts"]  # killed once, started again by recovery
    reader = store.reader()
    ids = [e for k in reader.committed() for e in reader.read(k).episode_ids]
    abandoned = {int(g) for g in state.get("abandoned", {})}
    want = sorted(f"{g}/{i}" for g in range(4) if g not in abandoned for i in range(2))
    assert sorted(ids) == want and len(ids) == len(set(ids)), (ids, abandoned)
    assert before < 4 and not abandoned
