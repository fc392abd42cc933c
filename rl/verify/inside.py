"""The trusted programs the verifier sends into a sandbox, as source (each
runs there as one file, stdlib only), and how their results come back: one
JSON line after a marker, the last line of their output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RUNNER = (Path(__file__).with_name("runner.py")).read_text()
"""Python tasks' tests (rl/verify/runner.py)."""
SQL_RUNNER = (Path(__file__).with_name("sql_runner.py")).read_text()
SQL_MARKER = "@@SARL-SQL@@"
NODE_RUNNER = (Path(__file__).with_name("node_runner.py")).read_text()
NODE_MARKER = "@@SARL-NODE@@"
RESULT_MARKER = "@@SARL-VERIFY@@"
"""Starts the runner's result line (rl/verify/runner.py escapes "@" inside
the payload, so the marker occurs there once, at the start of the last line)."""


def runner_result(stdout: bytes) -> dict[str, Any] | None:
    """The runner's result: the JSON after the marker on the last line of its
    output, or None when there is none or it does not parse."""
    lines = stdout.decode(errors="replace").rstrip("\n").rsplit("\n", 1)
    last = lines[-1]
    if not last.startswith(RESULT_MARKER):
        return None
    try:
        result = json.loads(last[len(RESULT_MARKER) :])
    except (ValueError, RecursionError):
        return None
    return result if isinstance(result, dict) else None
