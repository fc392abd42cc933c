"""What the `sarl` command prints on stdout.

A command run with `--json` prints exactly one JSON document on stdout, and
nothing else, so that `sarl ... --json | jq` works. Libraries do not all
agree: DeepSpeed prints `Setting accelerator to CPU` on stdout when it is
imported, vLLM's engine process inherits the stdout file descriptor. So while
such a command runs, both `sys.stdout` and file descriptor 1 point at stderr
(for this process and every child it starts), and `emit_json` writes the
document to the real stdout, once.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

_document: IO[str] | None = None
_emitted = False


@contextlib.contextmanager
def json_stdout() -> Iterator[None]:
    """Send everything printed meanwhile to stderr; keep stdout for `emit_json`."""
    global _document, _emitted
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    old_stdout = sys.stdout
    sys.stdout = sys.stderr
    _document, _emitted = os.fdopen(os.dup(saved), "w"), False
    try:
        yield
    finally:
        sys.stdout.flush()
        _document.close()
        _document = None
        os.dup2(saved, 1)
        os.close(saved)
        sys.stdout = old_stdout


def emit_json(obj: Any, indent: int | None = None) -> None:
    """Print the command's one JSON document on stdout."""
    global _emitted
    if _document is None:
        print(json.dumps(obj, indent=indent))
        return
    if _emitted:
        raise RuntimeError("a --json command printed a second JSON document")
    _document.write(json.dumps(obj, indent=indent) + "\n")
    _document.flush()
    _emitted = True
