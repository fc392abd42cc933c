"""The Apptainer backend's command lines and spython wiring.

Apptainer cannot be installed on these machines (it is in neither Debian 12
nor PyPI), so these tests put a STAND-IN `apptainer` binary on PATH: it
records each command line spython produces and runs the contained command
WITHOUT isolation. They check what sarl asks Apptainer to do, not Apptainer
itself. On a cluster with Apptainer and `containers/sandbox.sif` built
(scripts/build-image.sh), `sarl sandbox run --backend apptainer --image
containers/sandbox.sif -- CMD` runs the real binary; the attacks of
test_sandbox.py have not been run against it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes import SandboxError, open_sandbox, run_once
from sandboxes.config import Limits, SandboxConfig

STAND_IN = """#!/bin/bash
# stand-in for apptainer (not the real binary): records, then runs unisolated
echo "$*" >> "$STAND_IN_LOG"
while [ "${1#-}" != "$1" ] && [ "$1" != "--version" ]; do shift; done
case "$1" in
  --version|version) echo "apptainer version 1.3.4"; exit 0 ;;
  instance) [ "$2" = list ] && echo '{"instances": []}'; exit 0 ;;
  exec)
    shift
    while [ $# -gt 0 ]; do
      # the container's /sandbox is a folder of the test's own on the host
      case "$1" in instance://*|*.sif) shift; exec "${@//cd \\/sandbox/cd $STAND_IN_WORK}" ;; esac
      shift
    done ;;
esac
exit 2
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").write_text(STAND_IN)
    (bindir / "apptainer").chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("STAND_IN_WORK", str(tmp_path / "work"))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the `singularity` link for spython goes
    (tmp_path / "sandbox.sif").write_bytes(b"")
    return log


def _cfg(tmp_path: Path, **limits: float) -> SandboxConfig:
    return SandboxConfig.model_validate(
        {
            "backend": {"type": "apptainer", "image": str(tmp_path / "sandbox.sif")},
            "limits": Limits(**limits).model_dump(),
        }
    )  # type: ignore[arg-type]


def test_apptainer_stand_in_one_shot_runs_contained_without_network(stand_in: Path, tmp_path: Path) -> None:
    r = run_once(["python3", "-c", "print(6 * 7)"], _cfg(tmp_path, memory_mb=256, processes=16, wall_s=7))
    assert r.exit_code == 0 and r.stdout == b"42\n"
    call = [c for c in stand_in.read_text().splitlines() if c.startswith("exec")][0]
    for flag in (
        "--containall",
        "--cleanenv",
        "--no-home",
        "--net --network none",
        "--writable-tmpfs",
        "--memory 256M",
        "--pids-limit 16",
        f"{tmp_path}/sandbox.sif timeout -s KILL 7",
    ):
        assert flag in call, flag


def test_apptainer_stand_in_instance_lifecycle_and_files(stand_in: Path, tmp_path: Path) -> None:
    with open_sandbox(_cfg(tmp_path)) as sb:
        r = sb.exec(["python3", "-c", "print(1 + 1)"], cwd="/tmp")
        assert r.stdout == b"2\n"
        sb.write_file(str(tmp_path / "f.txt"), "hello")  # the stand-in shares the host filesystem
        assert sb.read_file(str(tmp_path / "f.txt")) == b"hello"
        name = sb.name
    calls = stand_in.read_text().splitlines()
    start = [c for c in calls if "instance start" in c][0]
    assert "--containall" in start and "--network none" in start and start.endswith(f"sandbox.sif {name}")
    # every command hashes strings the same way, as in a bubblewrap sandbox (a reproducible verdict)
    assert any(c.startswith(f"exec --env=PYTHONHASHSEED=0 instance://{name} timeout -s KILL") for c in calls)
    assert calls[-1].endswith(f"instance stop {name}")


def test_apptainer_stand_in_snippet_takes_files_globals_stream_and_resets(stand_in: Path, tmp_path: Path) -> None:
    """The snippet call the verifier makes, on the Apptainer backend (stand-in binary)."""
    with open_sandbox(_cfg(tmp_path)) as sb:
        first = sb.name
        code = "import sys\nprint(open(PATH).read(), PARAMS['n'] + 1, sys.stdin.read())"
        r = sb.run_snippet(
            code,
            files={str(tmp_path / "sol.py"): "x = 1"},
            globals={"PATH": str(tmp_path / "sol.py"), "PARAMS": {"n": 41}},
            stream=b"tests",
            reset_after=True,
        )
        assert r.ok and r.stdout == b"x = 1 42 tests\n"
        assert sb.alive and sb.name == first
    calls = stand_in.read_text().splitlines()
    assert len([c for c in calls if "instance start" in c]) == 2  # reset_after: a fresh instance
    assert len([c for c in calls if "instance stop" in c]) == 2


def test_apptainer_stand_in_wall_time_kill_is_reported(stand_in: Path, tmp_path: Path) -> None:
    r = run_once(["sleep", "30"], _cfg(tmp_path, wall_s=0.5))
    assert r.limit == "wall_time" and r.exit_code is None


def test_apptainer_missing_image_is_a_clear_error(stand_in: Path, tmp_path: Path) -> None:
    cfg = SandboxConfig.model_validate({"backend": {"type": "apptainer", "image": str(tmp_path / "nope.sif")}})
    with pytest.raises(SandboxError, match="nope.sif does not exist: build it with scripts/build-image.sh"):
        run_once(["true"], cfg)


def test_apptainer_absent_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    cfg = SandboxConfig.model_validate({"backend": {"type": "apptainer", "image": str(tmp_path / "x.sif")}})
    with pytest.raises(SandboxError, match="neither apptainer nor singularity is installed"):
        run_once(["true"], cfg)
