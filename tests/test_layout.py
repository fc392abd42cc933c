"""The project's structural promises: one registry of roles, one tag key for
tagged unions, one way to commit files, a store free of the config schema,
a fast `--help`, one JSON document per `--json` command, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SARL, sarl, smoke_config, write_config

from rl.config import ROLES, Config, ConfigError, validate_config
from rl.fsio import CorruptFile, commit_dir, read_json, sweep_temporaries


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)


# ------------------------------------------------------------------ registry


def test_every_role_field_of_the_config_is_registered_with_its_class() -> None:
    from rl.run.config import RoleConfig
    from rl.run.executors import role_class
    from rl.run.role import Role

    sections = {
        n
        for n, f in Config.model_fields.items()
        if any(RoleConfig in getattr(a, "__mro__", ()) for a in getattr(f.annotation, "__args__", ()))
    }
    assert sections == set(ROLES) == {"smoke", "validation", "generator", "rollout", "learner", "eval"}
    for name, spec in ROLES.items():
        cls = role_class(name)
        assert issubclass(cls, Role) and cls.name == name, spec
        assert issubclass(spec.config, RoleConfig)


def test_a_config_without_a_role_is_valid_but_cannot_be_submitted(workdir: Path) -> None:
    cfg = validate_config({"run": {"name": "x"}}, "f.toml", cluster="local")
    assert cfg.roles() == {}
    path = write_config(workdir, '[run]\nname = "x"\n[verify]\nweights = {tests = 1.0}\n')
    shown = sarl("config", "show", str(path), "--cluster", "local", cwd=workdir)
    assert "[verify" in shown.stdout
    out = sarl("submit", str(path), "--cluster", "local", cwd=workdir, check=False)
    assert out.returncode == 2 and "no role is configured" in out.stderr
    assert not (workdir / "runs" / "x").exists()


# --------------------------------------------------------------- tagged unions


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"generator": {"engine": {"max_model_len": 2048}}}, ("generator", "engine", "vllm")),
        ({"generator": {"engine": {"type": "hf"}}}, ("generator", "engine", "hf")),
        ({"sandbox": {"backend": {"image": "x.sif", "type": "apptainer"}}}, ("sandbox", "backend", "apptainer")),
        ({"sandbox": {"backend": {}}}, ("sandbox", "backend", "bwrap")),
    ],
)
def test_a_section_without_its_tag_takes_the_default_backend(section: dict, expected: tuple[str, str, str]) -> None:
    cfg = validate_config({"run": {"name": "x"}, **section}, "f.toml", cluster="local")
    parent, key, tag = expected
    assert getattr(getattr(cfg, parent), key).type == tag


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"generator": {"engine": {"max_model_len": 8}}}, "f.toml: generator.engine.max_model_len: Input should be"),
        ({"generator": {"engine": {"type": "hf", "kv_cache_gb": 1}}}, "f.toml: generator.engine.kv_cache_gb: unknown"),
        ({"sandbox": {"backend": {"type": "apptainer", "imag": "x"}}}, "f.toml: sandbox.backend.imag: unknown key"),
        ({"generator": {"engine": {"type": "tgi"}}}, "f.toml: generator.engine.type: expected one of 'vllm', 'hf'"),
        ({"generator": {"engine": {"backend": "vllm"}}}, "f.toml: generator.engine.backend: unknown key"),
    ],
)
def test_errors_name_the_key_the_user_wrote(section: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate_config({"run": {"name": "x"}, **section}, "f.toml", cluster="local")
    assert message in str(e.value)
    assert ".vllm." not in str(e.value) and ".hf." not in str(e.value) and ".apptainer." not in str(e.value)


def test_every_tagged_union_uses_the_type_key() -> None:
    from pydantic import BaseModel

    from rl.schema import TAG, models_in

    seen: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = [Config]
    unions = 0
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for name, field in m.model_fields.items():
            members = models_in(field.annotation)
            if len(members) > 1:
                unions += 1
                assert field.discriminator == TAG, f"{m.__name__}.{name}"
            todo += members
    assert unions >= 3  # executor, sandbox.backend, generator.engine


# ------------------------------------------------------------ committing files


def test_commit_dir_is_all_or_nothing(tmp_path: Path) -> None:
    final = tmp_path / "entry"

    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        commit_dir(final, broken)
    assert list(tmp_path.iterdir()) == []  # nothing half-built is left, under any name
    assert commit_dir(final, lambda tmp: (tmp / "a").write_text("1")) is True
    assert commit_dir(final, lambda tmp: (tmp / "a").write_text("2")) is False  # the first commit stands
    assert (final / "a").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_sweep_removes_what_dead_writers_left(tmp_path: Path) -> None:
    (tmp_path / ".v1.tmp-abc").mkdir()
    (tmp_path / ".f.json.tmp-def").write_text("{")
    (tmp_path / "v1").mkdir()
    assert sweep_temporaries(tmp_path) == 2 and [p.name for p in tmp_path.iterdir()] == ["v1"]


def test_a_garbage_json_file_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "torn.json").write_text('{"a": ')
    for name, why in (("empty.json", "empty"), ("torn.json", "not JSON")):
        with pytest.raises(CorruptFile) as e:
            read_json(tmp_path / name)
        assert str(tmp_path / name) in str(e.value) and why in str(e.value)
    assert read_json(tmp_path / "missing.json") is None


def test_the_commit_code_exists_once() -> None:
    """Only rl/fsio.py renames a temporary into place."""
    offenders = []
    for path in [*REPO.glob("rl/**/*.py"), *REPO.glob("jobs/*.py")]:
        text = path.read_text()
        if path.name != "fsio.py" and ("os.rename(" in text or "os.replace(" in text or "mkdtemp(dir=" in text):
            offenders.append(str(path.relative_to(REPO)))
    # weights retention renames a version away before deleting it: a removal, not a commit
    assert offenders == ["rl/store/weights.py"], offenders
    assert (REPO / "rl/store/weights.py").read_text().count("os.rename(") == 1


# ----------------------------------------------------------------- the store


def test_the_store_imports_neither_the_config_nor_pydantic(workdir: Path) -> None:
    code = (
        "import sys; import rl.store, rl.store.weights, rl.store.rollouts, rl.store.inspect;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic' or m.startswith('rl.')))"
    )
    out = _python(code, workdir)
    assert out.returncode == 0, out.stderr
    loaded = eval(out.stdout)  # a printed list of module names
    assert not [m for m in loaded if m.startswith("pydantic")], loaded
    assert set(loaded) <= {
        "rl.errors",
        "rl.fsio",
        "rl.store",
        "rl.store.weights",
        "rl.store.rollouts",
        "rl.store.inspect",
        "rl.store.zgroup",
    }, loaded


# ------------------------------------------------------------------- the CLI


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
    (run / "run.toml").write_text('[run]\nname = "j"\nroot = ".."\n[executor]\ntype = "local"\n[smoke]\n')
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
    }
    costly = {
        "bench store",
        "bench sandbox",
        "bench verify",
        "bench generate",
        "bench submit",
        "bench rollout",
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
        '[run]\nname = "v"\nroot = ".."\n[executor]\ntype = "local"\n'
        f'[validation]\ntasks_file = "{workdir / "bad.jsonl"}"\n'
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
    cfg = write_config(workdir, smoke_config(tasks=2, steps=200, step_s=0.1))
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
    cfg = write_config(workdir, smoke_config(tasks=1, steps=1, step_s=0))
    out = sarl("submit", str(cfg), "--cluster", "local", cwd=workdir, check=False)
    assert out.returncode == 2 and "exists and is not a run directory" in out.stderr
    assert sorted(os.listdir(workdir / "runs" / "t")) == ["notes.txt"]
