"""Sandboxes: where model-written code runs, isolated and limited.

    open_sandbox(cfg)  a persistent sandbox (exec, run_snippet, write_file,
                       read_file, reset, close; a context manager)
    run_once(argv)     one command in a fresh sandbox
    WarmPool(cfg)      ready sandboxes, refilled in the background

Backends are chosen by `cfg.backend.type`: `bwrap` (bubblewrap, default) or
`apptainer` (SIF images through spython). Each is imported only when chosen.
"""

from __future__ import annotations

from typing import Any

from sandboxes.base import ExecResult, SandboxDied, SandboxError
from sandboxes.config import Limits, SandboxConfig

__all__ = [
    "ExecResult",
    "Limits",
    "SandboxConfig",
    "SandboxDied",
    "SandboxError",
    "interpreter",
    "open_sandbox",
    "run_once",
]


def interpreter(cfg: SandboxConfig) -> tuple[str, list[str]]:
    """(path of the runtime's Python inside the sandbox, the host trees it
    shows besides /usr): what code inside may read without it counting as a
    look at the host's secrets."""
    if cfg.backend.type == "apptainer":
        return "python3", []  # the image is the whole filesystem
    from sandboxes.isolation import Runtime

    rt = Runtime(cfg.runtime, cfg.packages)
    return rt.python, rt.trees


def open_sandbox(cfg: SandboxConfig | None = None, preload: tuple[str, ...] = ()) -> Any:
    """A persistent sandbox. `preload`: host files of trusted code that its
    resident compiles once, before any message (snippets with `cache=True`
    of the same text then skip their compile); the apptainer backend
    compiles each message's."""
    cfg = cfg or SandboxConfig()
    if cfg.backend.type == "apptainer":
        from sandboxes.apptainer import ApptainerSandbox

        return ApptainerSandbox(cfg)
    from sandboxes.bwrap import BwrapSandbox

    return BwrapSandbox(cfg, preload)


def run_once(
    argv: list[str], cfg: SandboxConfig | None = None, stdin: bytes = b"", files: dict[str, bytes] | None = None
) -> ExecResult:
    cfg = cfg or SandboxConfig()
    if cfg.backend.type == "apptainer":
        from sandboxes import apptainer

        if files:
            raise SandboxError("run_once with files is not supported by the apptainer backend; use open_sandbox")
        return apptainer.run_once(argv, cfg, stdin)
    from sandboxes import oneshot

    return oneshot.run_once(argv, cfg, stdin, files)
