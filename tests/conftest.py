"""Shared helpers: run the real `sarl` command, write configs, read state."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SARL = [sys.executable, "-m", "jobs.cli"]


def sarl(
    *args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run the `sarl` command in a subprocess, as a user would. The timeout
    catches a hang, not a slow machine: a quick bench took over 120 s with
    two busy loops beside the suite."""
    proc = subprocess.run([*SARL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"sarl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_config(folder: Path, body: str, name: str = "run.toml") -> Path:
    path = folder / name
    path.write_text(body)
    return path


def run_config(name: str, *, recovery: bool | dict[str, Any] = True, **sections: Any) -> str:
    """A run config as TOML text, from its sections as dicts: a dict inside a
    section is a sub-section (`rollout={"agent": {"max_turns": 1}}`), a path
    becomes a string, a None value is left out. `run` holds the run's keys
    beside its `name` and root ("runs"). `recovery`: False turns automatic
    recovery off (the tests of the manual path: a FAILED task, `sarl
    resume`); a dict gives its keys; True leaves the defaults. Tests of a
    malformed file write their text themselves."""
    import tomli_w

    run: dict[str, Any] = {"name": name, "root": "runs", **sections.pop("run", {})}
    if recovery is False:
        run["recovery"] = {"enabled": False}
    elif isinstance(recovery, dict):
        run["recovery"] = recovery
    return tomli_w.dumps(_toml_values({"run": run, **sections}))


def merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """`base` with `more`'s keys, sub-sections merged key by key."""
    out = dict(base)
    for k, v in more.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _toml_values(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _toml_values(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_toml_values(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def smoke_config(
    name: str = "t",
    workers: int = 4,
    steps: int = 5,
    step_s: float = 0.2,
    recovery: bool | dict[str, Any] = False,
    **sections: Any,
) -> str:
    """A run of the smoke role alone. Recovery is off unless asked for: most
    smoke tests watch the manual paths (a FAILED task, `sarl resume`);
    tests/test_recovery.py gives its own. `smoke` adds keys to the smoke
    section (`fail_tasks`, `job`), other keywords other sections."""
    smoke = {"workers": workers, "steps": steps, "step_s": step_s, **sections.pop("smoke", {})}
    return run_config(name, recovery=recovery, smoke=smoke, **sections)


def status(run_dir: Path) -> dict[str, Any]:
    out = sarl("status", str(run_dir), "--json", cwd=run_dir.parent)
    return json.loads(out.stdout)


def task_state(run_dir: Path, task: int, role: str = "smoke") -> dict[str, Any]:
    return json.loads((run_dir / "checkpoints" / role / f"task-{task:06d}.json").read_text())


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="session")
def slurm() -> None:
    """The local Slurm of scripts/slurm-up.sh must be running (CI starts it)."""
    ok = shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0
    if not ok:
        pytest.fail("no Slurm answers here: run scripts/slurm-up.sh (as root) first")


def _queue() -> list[str]:
    """Every job the local Slurm holds, in any state (COMPLETING included).
    slurmctld can be slow to answer on a loaded machine (it writes its state
    to disk at every job change): it is given minutes, not seconds."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T %r"], capture_output=True, text=True, timeout=180)
    return out.stdout.split("\n")[:-1] if out.returncode == 0 else []


def _clear_queue(why: str) -> None:
    """Cancel every job in the queue and wait until none is left; fail with
    the queue and the node's state (a node whose slurmd is gone keeps its
    jobs RUNNING) where they stay."""
    for _ in range(3):  # a busy slurmctld can miss one scancel's timeout
        left = [line.split()[0] for line in _queue()]
        if not left:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(["scancel", *left], capture_output=True, timeout=60)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not _queue(), 60, "the queue to empty")
            return
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t %E"], capture_output=True, text=True, timeout=180)
    pytest.fail(f"{why}: jobs would not leave the queue after scancel: {_queue()}; node: {node.stdout.strip()}")


@pytest.fixture(autouse=True)
def _slurm_isolated(request: pytest.FixtureRequest) -> Any:
    """A Slurm test starts on an empty queue and leaves none of its jobs
    behind: a job left running (or still completing) by one test would hold
    the node's CPUs and leave the next test's jobs pending. What a test
    leaves is cancelled at its teardown (an error there names the test that
    left it); what an interrupted earlier test left is cancelled before the
    next starts, so that one leak fails one test, not every one after it."""
    if request.node.get_closest_marker("slurm") is None or not shutil.which("squeue"):
        yield
        return
    _clear_queue("before the test, left by an earlier one")
    yield
    _clear_queue("left by this test")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries what a reader needs to tell why: the
    Slurm queue, and the end of every role log its runs wrote."""
    report = yield
    if report.failed and call.when == "call":
        if item.get_closest_marker("slurm") is not None and shutil.which("squeue"):
            try:  # what a report adds must not hide the failure it reports
                queue = "\n".join(_queue()) or "(empty)"
            except subprocess.TimeoutExpired:
                queue = "(squeue did not answer within its timeout)"
            report.sections.append(("Slurm queue at the failure", queue))
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        logs = sorted(Path(tmp).glob("**/logs/**/*_log.*"))[-12:] if tmp else []
        for log in logs:
            lines = log.read_text(errors="replace").splitlines()[-25:]
            report.sections.append((f"end of {log.relative_to(tmp)}", "\n".join(lines)))
    return report


@pytest.fixture
def own_slot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """One sandbox slot for this test alone, from a private slot folder: every
    sandbox the test opens takes it, one after another, and a second one finds
    none free. A slot's number names a uid and cgroups of the whole node
    (sandboxes.cgroups.SLOTS): slot 0 of a private folder was the other
    stream's slot 0, and opening a sandbox on it killed that stream's sandbox.
    So the number is first reserved in the node's own slot folder (and, as
    root, uid lock folder), far above the numbers the other stream's
    sandboxes take; the test then locks it in private folders of its own."""
    import sandboxes.cgroups as cg

    monkeypatch.setattr(cg, "SLOTS", range(4000, 4096))
    reserved = cg.Slot.acquire()
    monkeypatch.setattr(cg, "SLOT_DIR", tmp_path / "slots")
    monkeypatch.setattr(cg, "UID_LOCK_DIR", tmp_path / "uids")
    monkeypatch.setattr(cg, "SLOTS", range(reserved.n, reserved.n + 1))
    yield reserved.n
    reserved.release()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def no_slurm_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH holds the interpreter but no Slurm client."""
    bindir = tmp_path / "bin-no-slurm"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    env = dict(os.environ)
    env["PATH"] = str(bindir)
    return env


# ------------------------------------------------------------------ suite rules


# `--stream 1|2|3` (scripts/test.sh runs the three side by side): stream 1
# holds every Slurm test (they share the node and its queue, so they run one
# after another) and the files of STREAM_1_FILES; stream 2 those of
# STREAM_2_FILES; stream 3 the rest. A slow test waits on processes, sockets
# and Slurm for a good part of its time: two streams left the two cores idle
# in those waits, and the whole suite took 45 min 43 s. The split is by
# measured time: about a third of the suite's each. With two busy loops
# beside them, the streams took 57, 66 and 59 min, test_gateway.py (about
# 4 of those minutes) in stream 2; it moved to stream 1.
STREAM_1_FILES = {
    "test_bench_learn.py",
    "test_gateway.py",
    "test_generator_role.py",
    "test_precision.py",
    "test_run.py",
    "test_scale.py",
    "test_slurm.py",
    "test_task_sets.py",
    "test_tasks_generate.py",
}
STREAM_2_FILES = {
    "test_agent.py",
    "test_environments.py",
    "test_generate.py",
    "test_learner.py",
    "test_learner_ranks.py",
    "test_rollout.py",
    "test_verify_under_load.py",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stream", choices=["1", "2", "3"], default=None, help="run one third of the suite (see conftest)"
    )


def _stream(item: pytest.Item) -> str:
    if item.get_closest_marker("slurm") is not None or item.path.name in STREAM_1_FILES:
        return "1"
    return "2" if item.path.name in STREAM_2_FILES else "3"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With `--stream`, only that third of the suite runs. A test that uses the
    local Slurm must say so with the `slurm` marker (so that `-m "not slurm"`
    runs on a machine without one, and `--stream` keeps it in stream 1)."""
    stream = config.getoption("--stream")
    if stream is not None:
        config.hook.pytest_deselected(items=[i for i in items if _stream(i) != stream])
        items[:] = [i for i in items if _stream(i) == stream]
    unmarked = [
        item.nodeid
        for item in items
        if "slurm" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slurm") is None
    ]
    if unmarked:
        raise pytest.UsageError("tests that use the slurm fixture need @pytest.mark.slurm: " + ", ".join(unmarked))


def _untracked() -> set[str] | None:
    """Files in the repository that git neither tracks nor ignores (None: not a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(out.stdout.splitlines()) if out.returncode == 0 else None


_BEFORE: set[str] | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _BEFORE
    _BEFORE = _untracked()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests write only under their temporary folders: a file that appeared in
    the repository during the run fails the session and is named."""
    after = _untracked()
    if _BEFORE is None or after is None:
        return
    new = sorted(after - _BEFORE)
    if new:
        print(f"\ntests left files in the repository {REPO}: {', '.join(new[:20])}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Llama with SmolLM2's tokenizer and architecture (2 layers of
    width 64, random weights from a fixed seed): a real model, sized so that
    a learner step takes a second here."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl.model import ModelConfig, checkpoint, load_tokenizer

    base = checkpoint(ModelConfig(dtype="float32"))
    cfg = AutoConfig.from_pretrained(base)
    cfg.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})
    cfg.update({"num_key_value_heads": 2, "head_dim": 16})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    out = tmp_path_factory.mktemp("tiny-smollm2")
    model.save_pretrained(out)
    load_tokenizer(base).save_pretrained(out)
    return out


def hf_worker(
    root: Path, name: str, tasks_file: Path, tiny_model: Path, rollout: dict[str, Any], **sections: Any
) -> tuple[Any, Any, dict]:
    """A real rollout Worker of run `name` under `root`, for the tiny model on
    the HF engine (started by the test), with `rollout`'s settings and any
    other `sections` of the config: the worker, its config and its state."""
    from rl.config import validate_config
    from rl.rollout.worker import Worker
    from rl.run.role import context_of

    raw = {
        "run": {"name": name, "root": str(root), "seed": 1},
        "executor": {"type": "local"},
        "model": {"path": str(tiny_model), "dtype": "float32"},
        "generator": {"engine": {"type": "hf", "max_model_len": 1024}},
        "rollout": {"tasks_file": str(tasks_file), **rollout},
        **sections,
    }
    cfg = validate_config(raw, "test", cluster="local", base_dir=root)
    (cfg.run_dir / "endpoints").mkdir(parents=True)
    ctx = context_of(cfg, cfg.run_dir)
    return Worker(ctx, cfg.rollout), cfg, ctx.state


# ---------------------------------------------------- the built-in model, shared by the generation tests


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the built-in model, converted once for the session."""
    from rl.model import ModelConfig, checkpoint

    cache = tmp_path_factory.mktemp("sarl-cache")
    checkpoint(ModelConfig(dtype="float32", cache_dir=cache))
    return cache


@pytest.fixture(scope="session")
def model(model_cache: Path) -> Any:
    from rl.model import ModelConfig

    return ModelConfig(dtype="float32", cache_dir=model_cache)


@pytest.fixture(scope="session")
def tok(model: Any) -> Any:
    from rl.model import checkpoint, load_tokenizer

    return load_tokenizer(checkpoint(model))


@pytest.fixture(scope="session")
def hf(model: Any) -> Any:
    from rl.engine import make_engine
    from rl.engine.config import HFEngineConfig

    return make_engine(HFEngineConfig(max_model_len=512), model)
