#!/usr/bin/env bash
# The main job on the local default: install sarl, submit the smoke run as
# local processes and watch it to the end; then import the HumanEval tasks and
# validate all 164 in sandboxes as a 4-task job array (reference passes,
# trivial solutions fail, results stable, no duplicates), merged into a report
# and a clean task file in the run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi
run=runs/smoke
if [ -d "$run" ]; then echo "quickstart: $run exists; resuming it" >&2; fi
.venv/bin/sarl submit examples/smoke.toml --cluster local
.venv/bin/sarl status "$run" --wait
.venv/bin/sarl tasks import humaneval -o runs/humaneval.jsonl
.venv/bin/sarl submit examples/validate-humaneval.toml --cluster local
.venv/bin/sarl status runs/validate-humaneval --wait
.venv/bin/sarl tasks report runs/validate-humaneval
