"""The Apptainer backend (clusters), through spython.

Each sandbox is an Apptainer instance of a SIF image built from
`containers/sandbox.def` (`scripts/build-image.sh`), started contained:
`--containall --cleanenv --no-home` (no host home, no host /tmp, clean
environment), `--net --network none` (no network), `--writable-tmpfs` (a
throwaway writable layer), with Apptainer's cgroup limits (`--memory`,
`--pids-limit`; cgroup v2 with systemd delegation, as most clusters have).
Commands run through `apptainer exec instance://NAME`, under coreutils'
`timeout` for wall time. `reset()` restarts the instance.

Apptainer is in neither Debian 12 nor PyPI, so the tests run this module
against a stand-in binary that records its command lines, and say so in
their names. On a cluster, build the image (scripts/build-image.sh), then
`sarl sandbox run --backend apptainer --image containers/sandbox.sif -- CMD`
runs the real path end to end.
"""

from __future__ import annotations

import base64
import json
import shlex
import time
import uuid
from typing import Any

from sandboxes.base import ExecResult, SandboxError
from sandboxes.config import ApptainerBackend, Limits, SandboxConfig

FIXED_ENV = {"PYTHONHASHSEED": "0"}
"""Set in every command, as the bubblewrap sandbox sets it: a verdict is
reproducible (a set's order of strings must not change between runs)."""
CONTAIN = ["--containall", "--cleanenv", "--no-home", "--net", "--network", "none", "--writable-tmpfs"]


def limit_flags(limits: Limits) -> list[str]:
    return ["--memory", f"{limits.memory_mb}M", "--pids-limit", str(limits.processes)]


def _client(backend: ApptainerBackend) -> Any:
    """spython's client. spython always runs `singularity`, which Apptainer
    installs as a compatibility link; where only `apptainer` exists, a
    `singularity` link to it is put first on this process's PATH."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from spython.main import get_client

    if not shutil.which("singularity"):
        real = shutil.which("apptainer")
        if real is None:
            raise SandboxError("neither apptainer nor singularity is installed here (backend 'apptainer')")
        shim = Path(tempfile.gettempdir()) / f"sarl-apptainer-shim-{os.getuid()}"
        shim.mkdir(exist_ok=True)
        link = shim / "singularity"
        if not link.is_symlink() or os.readlink(link) != real:
            tmp = shim / f".singularity.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(real)
            tmp.replace(link)
        if str(shim) not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = f"{shim}{os.pathsep}{os.environ.get('PATH', '')}"
    if not Path(backend.image).exists():
        raise SandboxError(f"apptainer image {backend.image} does not exist: build it with scripts/build-image.sh")
    return get_client()


def _wrap(argv: list[str], limits: Limits, cwd: str) -> list[str]:
    """Wall time and working directory inside the container."""
    inner = f"cd {shlex.quote(cwd)} && exec " + shlex.join(argv)
    return ["timeout", "-s", "KILL", f"{limits.wall_s:g}", "/bin/sh", "-c", inner]


def _result(res: Any, t0: float) -> ExecResult:
    if isinstance(res, dict):
        code, message = int(res.get("return_code", 1)), res.get("message", "")
    else:
        code, message = 0, res
    text = message if isinstance(message, str) else "".join(message)
    limit = "wall_time" if code in (137, -9) else None  # timeout -s KILL: 128+9, or killed with its group
    return ExecResult(
        exit_code=None if limit else code,
        stdout=text.encode(),
        stderr=b"",
        limit=limit,
        duration_s=time.monotonic() - t0,
        enforced={
            "wall_time": "timeout(1)",
            "memory": "apptainer --memory (cgroup)",
            "processes": "apptainer --pids-limit (cgroup)",
            "disk": "writable tmpfs",
        },
    )


class ApptainerSandbox:
    """A persistent sandbox: one contained Apptainer instance."""

    def __init__(self, cfg: SandboxConfig):
        if not isinstance(cfg.backend, ApptainerBackend):
            raise SandboxError("ApptainerSandbox needs an apptainer backend config")
        self.cfg = cfg
        self.backend = cfg.backend
        self.client = _client(cfg.backend)
        self.name = f"sarl-{uuid.uuid4().hex[:10]}"
        self.instance: Any = None
        self._start()

    def _start(self) -> None:
        options = CONTAIN + limit_flags(self.cfg.limits)
        self.instance = self.client.instance(self.backend.image, name=self.name, options=options, quiet=True)
        if self.instance is None:
            raise SandboxError(f"apptainer could not start an instance of {self.backend.image}")

    def exec(
        self,
        argv: list[str],
        stdin: bytes = b"",
        limits: Limits | None = None,
        env: dict[str, str] | None = None,
        cwd: str = "/sandbox",
    ) -> ExecResult:
        lim = limits or self.cfg.limits
        command = _wrap(argv, lim, cwd)
        if stdin:
            b64 = base64.b64encode(stdin).decode()
            command = ["/bin/sh", "-c", f"echo {b64} | base64 -d | " + shlex.join(command)]
        t0 = time.monotonic()
        res = self.client.execute(
            self.instance,
            command,
            return_result=True,
            quiet=True,
            options=[f"--env={k}={v}" for k, v in {**FIXED_ENV, **(env or {})}.items()],
        )
        return _result(res, t0)

    def run_snippet(
        self,
        code: str,
        limits: Limits | None = None,
        stream: bytes = b"",
        files: dict[str, bytes | str] | None = None,
        reset_after: bool = False,
        globals: dict[str, Any] | None = None,
        cache: bool = False,
    ) -> ExecResult:
        """The bwrap backend's snippet call, in a fresh `python3` of the
        instance: `files` are written first, `globals` set before the code
        runs, `stream` is its stdin (a pipe: not in its memory until read),
        and `reset_after` restarts the instance. `cache` has no effect here."""
        for path, data in (files or {}).items():
            self.write_file(path, data)
        if globals:
            code = f"import json as _j\nglobals().update(_j.loads({json.dumps(globals)!r}))\ndel _j\n" + code
        try:
            return self.exec(["python3", "-c", code], stdin=stream, limits=limits)
        finally:
            if reset_after:
                self.reset()

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        raw = data.encode() if isinstance(data, str) else data
        b64 = base64.b64encode(raw).decode()
        q = shlex.quote(path)
        r = self.exec(
            ["/bin/sh", "-c", f"mkdir -p $(dirname {q}) && echo {b64} | base64 -d > {q} && chmod {mode:o} {q}"],
            cwd="/",
        )
        if not r.ok:
            raise SandboxError(f"write {path}: {r.stdout.decode(errors='replace')}")

    def read_file(self, path: str, max_bytes: int = 1 << 30) -> bytes:
        r = self.exec(["/bin/sh", "-c", f"base64 < {shlex.quote(path)}"], cwd="/")
        if not r.ok:
            raise SandboxError(f"read {path}: {r.stdout.decode(errors='replace')}")
        return base64.b64decode(r.stdout)[:max_bytes]

    def reset(self) -> None:
        self.close()
        self._start()

    @property
    def alive(self) -> bool:
        return self.instance is not None

    def answers(self, timeout: float = 5.0) -> bool:
        """Whether the instance runs a command within `timeout` seconds; one
        that does not is closed."""
        if self.instance is None:
            return False
        try:
            ok = self.exec(["true"], limits=Limits(wall_s=timeout)).exit_code == 0
        except SandboxError:
            ok = False
        if not ok:
            self.close()
        return ok

    def close(self) -> None:
        if self.instance is not None:
            try:
                self.instance.stop()
            finally:
                self.instance = None

    def __enter__(self) -> ApptainerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_once(argv: list[str], cfg: SandboxConfig, stdin: bytes = b"") -> ExecResult:
    """One command in a fresh contained container (no instance)."""
    assert isinstance(cfg.backend, ApptainerBackend)
    client = _client(cfg.backend)
    t0 = time.monotonic()
    res = client.execute(
        cfg.backend.image,
        _wrap(argv, cfg.limits, "/tmp"),
        return_result=True,
        quiet=True,
        options=CONTAIN + limit_flags(cfg.limits),
    )
    return _result(res, t0)
