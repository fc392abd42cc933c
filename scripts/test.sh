#!/usr/bin/env bash
# Everything the tests need, then the tests: .venv with the dev tools, bubblewrap,
# a local Slurm (Debian packages, started as root), then ruff, mypy and pytest.
#   sudo scripts/test.sh [PYTEST ARGS...]
# The Debian packages and Slurm come up while pip installs, and DeepSpeed's op
# compiles while ruff and mypy run: on a fresh 2-core machine that saves minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
(
  if ! command -v bwrap >/dev/null; then  # sandboxes: bubblewrap, and setpriv from util-linux
    apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq bubblewrap util-linux >/dev/null
  fi
  scripts/slurm-up.sh
) >"$logs/system" 2>&1 &
system=$!
scripts/setup.sh dev,cpu
if ! wait "$system"; then
  cat "$logs/system" >&2; echo "test: bubblewrap or the local Slurm failed to come up (above)" >&2; exit 1
fi
tail -n 3 "$logs/system" >&2
# DeepSpeed compiles its CPU communication op at the first learner start
# (about a minute here); build it once, so that no test's timing includes it
.venv/bin/python -c "from rl.learner.dist import build_ops; build_ops()" >"$logs/ops" 2>&1 &
ops=$!
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
if ! wait "$ops"; then
  cat "$logs/ops" >&2; echo "test: DeepSpeed's CPU op failed to build (above)" >&2; exit 1
fi
rm -rf "$logs"
.venv/bin/python -m pytest "$@"
