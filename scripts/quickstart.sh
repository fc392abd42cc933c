#!/usr/bin/env bash
# The main job on the local default: install sarl, submit the smoke run as
# local processes, watch it to the end with a progress bar, show its status.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
run=runs/smoke
if [ -d "$run" ]; then echo "quickstart: $run exists; resuming it" >&2; fi
.venv/bin/sarl submit examples/smoke.toml --cluster local
.venv/bin/sarl status "$run" --wait
