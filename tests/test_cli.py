"""The `sarl` command: a fast `--help`, one JSON document per `--json`
command, and errors a user can cause as messages, not tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SARL, run_config, sarl, smoke_config, write_config


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_help_is_fast_and_imports_nothing_heavy(workdir: Path) -> None:
    code = (
        "import sys, time; t = time.perf_counter(); from jobs.cli import parser; p = parser();"
        "p.format_help(); dt = time.perf_counter() - t;"
        "heavy = [m for m in ('torch', 'deepspeed', 'vllm', 'transformers', 'zarr', 'numpy', 'pydantic',"
        " 'submitit') if m in sys.modules]; print(dt, heavy)"
    )
    out = _python(code, workdir)
    dt, heavy = out.stdout.split(" ", 1)
    assert heavy.strip() == "[]", out.stdout
    t0 = time.perf_counter()
    help_out = subprocess.run([*SARL, "--help"], capture_output=True, text=True, cwd=workdir, timeout=60)
    wall = time.perf_counter() - t0
    assert help_out.returncode == 0 and "submit" in help_out.stdout
    assert wall < 1.0, f"sarl --help took {wall:.2f} s (parser {float(dt):.3f} s)"


def _json_commands() -> set[str]:
    """Every command that prints a JSON document: those with --json, and
    those that print one always (`set_defaults(json=True)`)."""
    import argparse

    from jobs.cli import parser

    found = set()

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
        if any("--json" in a.option_strings for a in p._actions) or p.get_default("json"):
            found.add(prefix)

    walk(parser(), "")
    return found


def test_json_output_is_one_document_even_when_libraries_print(workdir: Path) -> None:
    """The mechanism every --json command runs under: prints of this process,
    of C code (fd 1) and of child processes go to stderr."""
    code = (
        "import os, subprocess, sys\n"
        "from jobs.output import json_stdout, emit_json\n"
        "with json_stdout():\n"
        "    print('[real_accelerator.py] Setting accelerator to CPU')\n"
        "    os.write(1, b'from C\\n')\n"
        "    subprocess.run([sys.executable, '-c', 'print(\"from a child\")'])\n"
        "    emit_json({'ok': 1})\n"
        "print('after')\n"
    )
    out = _python(code, workdir)
    assert out.returncode == 0, out.stderr
    assert out.stdout == '{"ok": 1}\nafter\n'
    assert "Setting accelerator" in out.stderr and "from C" in out.stderr and "from a child" in out.stderr


@pytest.mark.slow
def test_every_json_command_prints_exactly_one_document(workdir: Path) -> None:
    """Each JSON command, run for real; the costly benchmarks are run by
    their own tests (test_store, test_sandbox, test_verify, test_generate,
    test_slurm, test_rollout, test_rollout_queue, test_learner, test_eval, test_export, test_bench_learn,
    test_bench_rl, test_chaos), which parse
    stdout the same way: `json.loads(stdout)`."""
    run = workdir / "runs" / "j"
    (run / "store.zarr").mkdir(parents=True)
    (run / "run.toml").write_text(run_config("j", run={"root": ".."}, executor={"type": "local"}, smoke={}))
    tasks = workdir / "tasks.jsonl"
    sarl("tasks", "import", "humaneval", "-o", str(tasks), cwd=workdir)
    samples = workdir / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "HumanEval/0", "completion": "    return False\n"}) + "\n")
    cases = {
        "status": ["status", str(run), "--json"],
        "store inspect": ["store", "inspect", str(run), "--json"],
        "sandbox run": ["sandbox", "run", "--", "echo", "hi"],
        "config schema": ["config", "schema"],
        "tasks schema": ["tasks", "schema"],
        "verify": ["verify", str(tasks), str(samples)],
        "tasks leaks": ["tasks", "leaks", str(tasks), str(workdir / "gen.jsonl"), "--json"],
    }
    sarl("tasks", "generate", "-n", "4", "-o", str(workdir / "gen.jsonl"), cwd=workdir)  # nothing of HumanEval
    costly = {
        "bench store",
        "bench sandbox",
        "bench verify",
        "bench generate",
        "bench submit",
        "bench rollout",
        "bench endpoint",  # tests/test_gateway.py
        "bench learner",
        "bench learn",
        "bench rl",
        "chaos",
        "eval",
        "export",
        "tasks quarantined",
        "generate",
        "tasks report",
    }
    assert _json_commands() == set(cases) | costly, "a new JSON command needs a case here or a test of its own"
    for name, argv in cases.items():
        out = sarl(*argv, cwd=workdir, check=False)
        assert out.returncode == 0, (name, out.stderr[-2000:])
        json.loads(out.stdout)  # the whole of stdout is one document
        assert out.stdout.count("\n") == out.stdout.strip().count("\n") + 1, name


# -------------------------------------------------------------------- errors


def test_user_errors_end_in_a_message_not_a_traceback(workdir: Path) -> None:
    run = workdir / "runs" / "v"
    run.mkdir(parents=True)
    (run / "run.toml").write_text(
        run_config(
            "v", run={"root": ".."}, executor={"type": "local"}, validation={"tasks_file": workdir / "bad.jsonl"}
        )
    )
    (workdir / "bad.jsonl").write_text('{"task_id": "a"}\n')
    bad_tasks = sarl("tasks", "report", str(run), cwd=workdir, check=False)
    (workdir / "samples.jsonl").write_text("not json\n")
    bad_samples = sarl("verify", str(workdir / "bad.jsonl"), str(workdir / "samples.jsonl"), cwd=workdir, check=False)
    not_a_run = sarl("status", str(workdir), cwd=workdir, check=False)
    for out, what in ((bad_tasks, "bad.jsonl:1"), (bad_samples, "bad.jsonl:1"), (not_a_run, "not a run directory")):
        assert out.returncode == 2 and what in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_submit_into_a_live_run_says_that_nothing_was_resubmitted(workdir: Path) -> None:
    cfg = write_config(workdir, smoke_config(workers=2, steps=200, step_s=0.1))
    sarl("submit", str(cfg), "--cluster", "local", cwd=workdir)
    try:
        again = sarl("submit", str(cfg), "--cluster", "local", cwd=workdir)
        assert again.stdout == ""
        assert "nothing to resubmit" in again.stderr and "smoke: 0 done, 2 alive" in again.stderr
    finally:
        sarl("cancel", str(workdir / "runs" / "t"), cwd=workdir)


def test_a_folder_in_the_way_of_a_new_run_is_a_clear_error(workdir: Path) -> None:
    (workdir / "runs" / "t").mkdir(parents=True)
    (workdir / "runs" / "t" / "notes.txt").write_text("mine")
    cfg = write_config(workdir, smoke_config(workers=1, steps=1, step_s=0))
    out = sarl("submit", str(cfg), "--cluster", "local", cwd=workdir, check=False)
    assert out.returncode == 2 and "exists and is not a run directory" in out.stderr
    assert sorted(os.listdir(workdir / "runs" / "t")) == ["notes.txt"]
