"""Config errors name the key and the file, and submit nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import run_config, sarl, smoke_config, task_state, wait_for, write_config

from rl.config import ROLES, Config, ConfigError, validate_config


def _fails(workdir: Path, body: str, *args: str, env: dict[str, str] | None = None, in_file: bool = True) -> str:
    cfg = write_config(workdir, body)
    out = sarl("submit", str(cfg), *args, cwd=workdir, env=env, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == ""  # no job id printed
    assert not (workdir / "runs").exists()  # no partial state
    assert (str(cfg) in out.stderr) == in_file
    return out.stderr


def test_unknown_key_is_named(workdir: Path) -> None:
    err = _fails(workdir, smoke_config(smoke={"job": {"cpus": 4}}), "--cluster", "local")
    assert "smoke.job.cpus: unknown key" in err


def test_wrong_type_is_named(workdir: Path) -> None:
    err = _fails(workdir, smoke_config(smoke={"job": {"mem_gb": "lots"}}), "--cluster", "local")
    assert "smoke.job.mem_gb" in err and "'lots'" in err


def test_out_of_range_value_is_named(workdir: Path) -> None:
    err = _fails(workdir, smoke_config(workers=0), "--cluster", "local")
    assert "smoke.workers" in err and "greater than or equal to 1" in err


def test_the_old_array_size_key_is_refused_with_its_new_name(workdir: Path) -> None:
    """`tasks` named a role's array size before it became `workers`; an old
    config (or an old run's run.toml) gets the new name, not a bare
    "extra field", and nothing is submitted."""
    body = smoke_config().replace("workers = 4", "tasks = 4")
    err = _fails(workdir, body, "--cluster", "local")
    assert "smoke" in err and "`tasks`" in err and "is now `workers`" in err, err


def test_missing_required_key_is_named(workdir: Path) -> None:
    err = _fails(workdir, "[smoke]\nworkers = 2\n", "--cluster", "local")
    assert "run: required key is missing" in err


def test_bad_run_name_is_named(workdir: Path) -> None:
    err = _fails(workdir, smoke_config(name="../escape"), "--cluster", "local")
    assert "run.name" in err


def test_invalid_toml_names_file(workdir: Path) -> None:
    err = _fails(workdir, "[run\nname = 1\n", "--cluster", "local")
    assert "not valid TOML" in err


def test_no_role_is_an_error(workdir: Path) -> None:
    err = _fails(workdir, run_config("x"), "--cluster", "local")
    assert "no role is configured" in err


def test_multi_node_needs_slurm(workdir: Path) -> None:
    err = _fails(workdir, smoke_config(smoke={"job": {"nodes": 2}}), "--cluster", "local")
    assert "smoke.job.nodes = 2 needs executor.type = 'slurm'" in err


@pytest.mark.parametrize(
    ("cores", "words"),
    [([0, 4096], "smoke.job.cpu_list = [0, 4096]: cores [4096] do not exist"), ([1, 1], "listed twice")],
)
def test_a_cpu_list_of_cores_that_do_not_exist_is_refused(workdir: Path, cores: list[int], words: str) -> None:
    err = _fails(workdir, smoke_config(smoke={"job": {"cpu_list": cores}}), "--cluster", "local")
    assert words in err


@pytest.mark.slurm
def test_a_cpu_list_on_slurm_is_refused(workdir: Path, slurm: None) -> None:
    err = _fails(workdir, smoke_config(smoke={"job": {"cpu_list": [0]}}, executor={"type": "slurm"}))
    assert "smoke.job.cpu_list: pinning to cores is for executor.type = 'local'" in err


def test_a_pinned_role_runs_on_its_cores_alone(workdir: Path) -> None:
    """`job.cpu_list` pins the task's process: its start record says which
    cores the kernel lets it run on."""
    import os

    core = max(os.sched_getaffinity(0))
    cfg = write_config(workdir, smoke_config(workers=2, steps=1, step_s=0, smoke={"job": {"cpu_list": [core]}}))
    sarl("submit", str(cfg), "--cluster", "local", cwd=workdir)
    run = workdir / "runs" / "t"
    done = lambda t: (run / "checkpoints" / "smoke" / f"task-{t:06d}.json").exists() and task_state(run, t)["done"]  # noqa: E731
    wait_for(lambda: done(0) and done(1), 120, "the smoke tasks")
    assert [task_state(run, t)["starts"][-1]["cpus"] for t in (0, 1)] == [[core], [core]]


@pytest.mark.slurm
def test_signal_after_time_limit_is_impossible(workdir: Path, slurm: None) -> None:
    body = smoke_config(smoke={"job": {"time_min": 1}}, executor={"type": "slurm", "signal_delay_s": 90})
    err = _fails(workdir, body)
    assert "executor.signal_delay_s = 90" in err and "smoke.job.time_min = 1" in err


def test_override_of_unknown_key_is_named(workdir: Path) -> None:
    err = _fails(workdir, smoke_config(), "--cluster", "local", "--set", "smoke.speed=3")
    assert "(with --set)" in err and "smoke.speed: unknown key" in err


def test_malformed_override(workdir: Path) -> None:
    err = _fails(workdir, smoke_config(), "--cluster", "local", "--set", "smoke.steps", in_file=False)
    assert "--set 'smoke.steps': expected KEY=VALUE" in err


@pytest.mark.slurm
def test_executor_must_be_chosen_where_slurm_is_installed(workdir: Path, slurm: None) -> None:
    err = _fails(workdir, smoke_config())
    assert "executor.type: not set, and Slurm is installed" in err


def test_slurm_executor_without_sbatch_is_refused(workdir: Path, no_slurm_env: dict[str, str]) -> None:
    err = _fails(workdir, smoke_config(), "--cluster", "slurm", env=no_slurm_env)
    assert "sbatch is not on PATH" in err


def test_local_is_the_default_without_slurm(workdir: Path, no_slurm_env: dict[str, str]) -> None:
    cfg = write_config(workdir, smoke_config())
    out = sarl("config", "show", str(cfg), cwd=workdir, env=no_slurm_env)
    assert '[executor]\ntype = "local"' in out.stdout


def test_override_values_are_typed(workdir: Path) -> None:
    cfg = write_config(workdir, smoke_config())
    out = sarl(
        "config",
        "show",
        str(cfg),
        "--cluster",
        "local",
        "--set",
        "smoke.step_s=2.5",
        "--set",
        "smoke.fail_tasks=[1, 3]",
        cwd=workdir,
    )
    assert "step_s = 2.5" in out.stdout and "fail_tasks = [\n    1,\n    3,\n]" in out.stdout


def test_config_doc_lists_every_key_with_docs(workdir: Path) -> None:
    cfg = write_config(workdir, smoke_config())
    out = sarl("config", "show", str(cfg), "--cluster", "local", "--doc", cwd=workdir).stdout
    assert "smoke.job.time_min  [safe mid-run]\n    Time limit of one job, in minutes." in out
    assert "smoke.workers\n    Number of tasks" in out
    assert "executor.partition" in out


def test_cli_does_not_import_heavy_libraries(workdir: Path) -> None:
    cfg = write_config(workdir, smoke_config())
    code = (
        f"import sys; from jobs.cli import main; main(['config', 'show', {str(cfg)!r}, '--cluster', 'local']);"
        "heavy = [m for m in ('torch', 'deepspeed', 'vllm', 'transformers', 'zarr') if m in sys.modules];"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=workdir, check=True)
    assert "HEAVY []" in out.stdout


# ------------------------------------------------------------- frozen config


@pytest.mark.slow
def test_existing_run_refuses_unsafe_change_and_keeps_frozen_config(workdir: Path) -> None:
    cfg = write_config(workdir, smoke_config(workers=1, steps=1, step_s=0))
    sarl("submit", str(cfg), "--cluster", "local", cwd=workdir)
    frozen = (workdir / "runs/t/run.toml").read_text()
    out = sarl("submit", str(cfg), "--cluster", "local", "--set", "smoke.steps=50", cwd=workdir, check=False)
    assert out.returncode == 2
    assert "cannot change mid-run: smoke.steps" in out.stderr
    assert (workdir / "runs/t/run.toml").read_text() == frozen
    assert len(list((workdir / "runs/t/submissions/smoke").glob("*.json"))) == 1


@pytest.mark.slow
def test_existing_run_accepts_safe_change_and_records_it(workdir: Path) -> None:
    cfg = write_config(workdir, smoke_config(workers=1, steps=1, step_s=0))
    sarl("submit", str(cfg), "--cluster", "local", cwd=workdir)
    out = sarl("submit", str(cfg), "--cluster", "local", "--set", "smoke.job.time_min=30", cwd=workdir)
    assert "accepted mid-run changes: smoke.job.time_min" in out.stderr
    assert "time_min = 30" in (workdir / "runs/t/run.toml").read_text()
    history = [json.loads(x) for x in (workdir / "runs/t/config-history.jsonl").read_text().splitlines()]
    assert history[-1]["changed"] == ["smoke.job.time_min"]


# ------------------------------------------------------------------ registry


def test_every_role_field_of_the_config_is_registered_with_its_class() -> None:
    from rl.run.executors import role_class
    from rl.run.role import Role
    from rl.schema import RoleConfig

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
    path = write_config(workdir, run_config("x", verify={"weights": {"tests": 1.0}}))
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


# ---------------------------------------------------------------- the docs


def test_the_configuration_reference_is_the_schemas(workdir: Path) -> None:
    """docs/configuration.md is generated (`sarl config reference -o ...`):
    a field added, removed or documented anew without regenerating it fails
    here."""
    from conftest import REPO

    from rl.configdoc import reference

    page = reference()
    assert (REPO / "docs" / "configuration.md").read_text() == page, (
        "docs/configuration.md is stale: sarl config reference -o docs/configuration.md"
    )
    for key in ("run.max_staleness", "rollout.groups_per_step", "learner.samples_per_step", "generator.engine.type"):
        assert f"**`{key}`**" in page
    assert "(`int | none`, resolved from `generator.engine.max_model_len`)" in page  # rollout.max_model_len
    out = sarl("config", "reference", cwd=workdir)
    assert out.stdout == page


def test_the_readmes_example_config_is_valid(workdir: Path) -> None:
    """The run config the README shows validates as it stands (with its task files present)."""
    import re

    from conftest import REPO

    from rl.tasks.format import write_tasks
    from rl.tasks.synthesis import synthesize

    readme = (REPO / "README.md").read_text()
    body = re.search(r"```toml\n(.*?)```", readme, re.S)
    assert body is not None
    tasks = synthesize("arithmetic", 6, seed=1)
    write_tasks(workdir / "train.jsonl", tasks[:4])
    write_tasks(workdir / "heldout.jsonl", tasks[4:])
    cfg = validate_config(tomllib.loads(body.group(1)), "README.md", cluster="local", base_dir=workdir)
    assert set(cfg.roles()) == {"generator", "rollout", "learner", "eval"}


@pytest.mark.parametrize("value", [-1.0, 0.001, 101.0, float("nan"), float("inf")])
def test_the_one_temperature_rule_refuses_the_same_values_everywhere(value: float) -> None:
    """The agent's config, an engine request and the OpenAI endpoint take a
    temperature by one type (rl.engine.config.Temperature); each refuses what
    the engines cannot take, naming the field, and takes 0 and 0.01."""
    from pydantic import ValidationError

    from rl.agent.config import AgentConfig
    from rl.engine.config import SamplingParams
    from rl.gateway.api import _Sampling

    for make in (AgentConfig, SamplingParams, lambda **kw: _Sampling(model="m", **kw)):
        with pytest.raises(ValidationError, match="temperature"):
            make(temperature=value)
        for fine in (0.0, 0.01, 1.5):
            assert make(temperature=fine).temperature == fine
        with pytest.raises(ValidationError, match="top_p"):
            make(top_p=1e-9)
