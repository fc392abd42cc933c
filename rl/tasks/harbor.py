"""Harbor task directories as sarl tasks (`sarl tasks import harbor DIR...`).

Harbor's layout (harborframework.com/docs/tasks):

    instruction.md         what the agent is asked
    task.toml              timeouts, resources, metadata
    environment/Dockerfile the container the agent works in (and its build context)
    tests/test.sh          run after the agent, in its final state; writes
                           /logs/verifier/reward.txt (a number) or reward.json
    solution/solve.sh      the oracle (optional)

A task becomes a `workspace` task with the `harbor` test format: the
instruction is the prompt, the files the Dockerfile copies into its WORKDIR
are the starting work dir, tests/ are the hidden tests (never in the work
dir), solve.sh is the reference. Grading (rl.verify.verifier) copies the
final work dir into a fresh sandbox, puts the tests under /tmp/harbor/tests,
runs test.sh, and reads the reward file it wrote.

The environment:
  - every task's Dockerfile is converted to an Apptainer definition with
    spython (`metadata.harbor.apptainer_def`), for a cluster's per-task image;
  - under bubblewrap (here), a Dockerfile may only FROM an image, set its
    WORKDIR, COPY or ADD files of its context into the WORKDIR, and state
    CMD, ENTRYPOINT, LABEL, EXPOSE or USER (ignored); anything else (a RUN
    step, ENV, a copy outside the WORKDIR) is refused with its line, because
    the sandbox runtime cannot meet it.
  - the sandbox's paths differ from the container's: the WORKDIR is
    /sandbox, /tests is /tmp/harbor/tests and /logs/verifier is
    /tmp/harbor/logs/verifier; the instruction, the tests and the oracle are
    rewritten accordingly (recorded in `metadata.harbor.paths`).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

from rl.tasks.format import Task, TaskError, TaskLimits

WORK = "/sandbox"
TESTS = "/tmp/harbor/tests"
LOGS = "/tmp/harbor/logs/verifier"
IGNORED = {"CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "USER", "MAINTAINER", "SHELL", "STOPSIGNAL", "HEALTHCHECK"}
MAX_FILE_BYTES = 1 << 20


def _rewrite(text: str, workdir: str) -> str:
    """Container paths as the sandbox has them."""
    text = re.sub(r"(?<![\w.-])/logs/verifier(?=/|\b|$)", LOGS, text)
    text = re.sub(r"(?<![\w.-])/tests(?=/|\b|$)", TESTS, text)
    if workdir not in ("", "/"):
        text = re.sub(r"(?<![\w.-])" + re.escape(workdir.rstrip("/")) + r"(?=/|\b|$)", WORK, text)
    return text


def _read_tree(folder: Path, where: str) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            raise TaskError(f"{p}: a symlink; {where} must hold plain files")
        if not p.is_file():
            continue
        if p.stat().st_size > MAX_FILE_BYTES:
            raise TaskError(f"{p}: larger than {MAX_FILE_BYTES} bytes")
        try:
            out[p.relative_to(folder).as_posix()] = p.read_text()
        except UnicodeDecodeError:
            raise TaskError(f"{p}: not a text file; {where} must hold text files") from None
    return out


def _dockerfile(path: Path) -> tuple[str, list[tuple[str, str]]]:
    """(WORKDIR, [(context path, destination)]) of a Dockerfile the sandbox
    runtime can meet; a TaskError naming the line of any other."""
    workdir, copies = "", []
    lines = path.read_text().splitlines()
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, line in enumerate(lines, start=1):  # continuation lines join their instruction
        if not buf:
            start = n
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        logical.append((start, buf + stripped))
        buf = ""
    for n, text in logical:
        word, _, rest = text.partition(" ")
        word = word.upper()
        if word == "FROM" or word in IGNORED or word == "ARG":
            continue
        if word == "WORKDIR":
            workdir = rest.strip()
            continue
        if word in ("COPY", "ADD"):
            args = [a for a in shlex.split(rest) if not a.startswith("--")]
            if len(args) < 2:
                raise TaskError(f"{path}:{n}: {word} needs a source and a destination")
            *sources, dest = args
            if not dest.startswith("/"):
                dest = (workdir.rstrip("/") or "") + "/" + dest
            dest = posixpath.normpath(dest) + ("/" if dest.endswith("/") else "")  # ./a/../b/ as Docker reads it
            if not workdir or not (dest == workdir or dest.startswith(workdir.rstrip("/") + "/")):
                raise TaskError(
                    f"{path}:{n}: {text!r}: the sandbox runtime holds only the WORKDIR ({workdir or 'none set'}); "
                    "build an Apptainer image for this task (metadata.harbor.apptainer_def)"
                )
            copies += [(s, dest) for s in sources]
            continue
        raise TaskError(
            f"{path}:{n}: {text[:80]!r}: the bubblewrap sandbox cannot meet {word} (it runs no build step and "
            "sets no environment); on a cluster, build the Apptainer image of metadata.harbor.apptainer_def"
        )
    return workdir, copies


def _apptainer_def(dockerfile: Path) -> str:
    """The Dockerfile as an Apptainer definition (spython), for a cluster."""
    try:
        from spython.main.parse.parsers import DockerParser
        from spython.main.parse.writers import SingularityWriter
    except ImportError:
        return ""
    path = dockerfile.resolve()
    try:
        with contextlib.chdir(path.parent):  # spython looks for the files it copies from here
            return str(SingularityWriter(DockerParser(str(path)).recipe).convert())
    except Exception:  # noqa: BLE001 (a definition spython cannot write is only a missing convenience)
        return ""


def _copied(dockerfile: Path, workdir: str, copies: list[tuple[str, str]], context: dict[str, str]) -> dict[str, str]:
    """The files the Dockerfile's COPY lines put under its WORKDIR, by path
    relative to it, with the image's paths rewritten to the sandbox's.
    Docker's rules: a folder's contents go into dest; a file to dest, or into
    dest/."""
    files: dict[str, str] = {}
    for src, dest in copies:
        rel = dest[len(workdir.rstrip("/")) :].strip("/")
        src = src.strip("/") if src not in (".", "./") else "."
        inside = {p: c for p, c in context.items() if src == "." or p.startswith(src + "/")}
        if inside:
            for p, c in inside.items():
                inner = p if src == "." else p[len(src) + 1 :]
                files[f"{rel}/{inner}" if rel else inner] = _rewrite(c, workdir)
        elif src in context:
            name = Path(src).name
            files[f"{rel}/{name}" if (dest.endswith("/") or not rel) and rel else (rel or name)] = _rewrite(
                context[src], workdir
            )
        else:
            raise TaskError(f"{dockerfile}: COPY {src}: no such file in environment/")
    files.pop("Dockerfile", None)
    return files


def import_harbor(folder: str | Path) -> Task:
    """One Harbor task directory as a task; a TaskError naming the file (and
    line) of anything that cannot be used."""
    d = Path(folder)
    for need in ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh"):
        if not (d / need).is_file():
            raise TaskError(f"{d}: not a Harbor task directory: {need} is missing")
    try:
        meta = tomllib.loads((d / "task.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{d / 'task.toml'}: not valid TOML: {e}") from None
    dockerfile = d / "environment" / "Dockerfile"
    workdir, copies = _dockerfile(dockerfile)
    files = _copied(dockerfile, workdir, copies, _read_tree(d / "environment", "environment/"))
    tests = {p: _rewrite(c, workdir) for p, c in _read_tree(d / "tests", "tests/").items()}
    solve = d / "solution" / "solve.sh"
    verifier = meta.get("verifier", {}) if isinstance(meta.get("verifier"), dict) else {}
    timeout = float(verifier.get("timeout_sec", 120.0))
    name = str((meta.get("task") or {}).get("name") or d.name) if isinstance(meta.get("task"), dict) else d.name
    md = meta.get("metadata", {}) if isinstance(meta.get("metadata"), dict) else {}
    return Task(
        task_id=f"harbor/{name}",
        prompt=_rewrite((d / "instruction.md").read_text(), workdir),
        entry_point="test.sh",
        tests=json.dumps(tests),
        test_format="harbor",
        environment="workspace",
        reference=_rewrite(solve.read_text(), workdir) if solve.is_file() else "",
        files=files,
        limits=TaskLimits(wall_s=min(timeout, 600.0), call_s=min(timeout, 600.0)),
        metadata={
            "source": "harbor",
            "family": "harbor",
            "template": f"harbor/{name}",
            "difficulty": {"easy": 1, "medium": 2, "hard": 3}.get(str(md.get("difficulty", "")).lower(), 2),
            "harbor": {
                "dir": str(d.resolve()),
                "workdir": workdir,
                "paths": {workdir or "/": WORK, "/tests": TESTS, "/logs/verifier": LOGS},
                "apptainer_def": _apptainer_def(dockerfile),
                "metadata": md,
            },
        },
    )


def harbor_reward(text: str, name: str) -> float | None:
    """The reward a test.sh wrote: reward.txt holds a number; reward.json an
    object whose `reward` (or, without it, the mean of its numbers) counts.
    None when it says nothing usable."""
    try:
        if name.endswith(".json"):
            data: Any = json.loads(text)
            if isinstance(data, int | float) and not isinstance(data, bool):
                value = float(data)
            elif isinstance(data, dict):
                nums = [v for v in data.values() if isinstance(v, int | float) and not isinstance(v, bool)]
                value = (
                    float(data["reward"])
                    if isinstance(data.get("reward"), int | float)
                    else (sum(nums) / len(nums) if nums else float("nan"))
                )
            else:
                return None
        else:
            value = float(text.strip())
    except (ValueError, TypeError):
        return None
    return None if value != value else min(1.0, max(0.0, value))
