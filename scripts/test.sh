#!/usr/bin/env bash
# Everything the tests need, then the tests: .venv with the dev tools, bubblewrap,
# a local Slurm (Debian packages, started as root), then ruff, mypy and pytest.
#   sudo scripts/test.sh [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev,cpu
if ! command -v bwrap >/dev/null; then  # sandboxes: bubblewrap, and setpriv from util-linux
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap util-linux >/dev/null
fi
scripts/slurm-up.sh
# DeepSpeed compiles its CPU communication op at the first learner start
# (about a minute here); build it once, so that no test's timing includes it
.venv/bin/python -c "from rl.learner.dist import build_ops; build_ops()"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
