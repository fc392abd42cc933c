#!/usr/bin/env bash
# Everything the tests need, then the tests: .venv with the dev tools, bubblewrap, Node.js,
# a local Slurm (Debian packages, started as root), then ruff, mypy and pytest.
#   sudo scripts/test.sh [PYTEST ARGS...]   (no arguments: the whole suite, in three streams)
#   sudo scripts/test.sh --fast [ARGS...]   (no slow, Slurm or GPU test: the tier for work)
# The Debian packages and Slurm come up while pip installs: on a fresh 2-core
# machine that saves minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
(
  # sandboxes: bubblewrap, and setpriv from util-linux; the node runtime of JavaScript tasks: nodejs
  if ! command -v bwrap >/dev/null || ! command -v node >/dev/null; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq bubblewrap util-linux nodejs >/dev/null
  fi
  scripts/slurm-up.sh
) >"$logs/system" 2>&1 &
system=$!
scripts/setup.sh dev,cpu
if ! wait "$system"; then
  cat "$logs/system" >&2; echo "test: bubblewrap or the local Slurm failed to come up (above)" >&2; exit 1
fi
tail -n 3 "$logs/system" >&2
# Role processes import torch, transformers, DeepSpeed and vLLM by the hundred in
# a test run. Where PYTHONDONTWRITEBYTECODE is set (as on some CI images), no
# import writes a bytecode cache and each one compiles them again: torch and
# transformers took 23 s of CPU against 10 s with the caches. The first import
# of each module now writes its cache.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
if [ "${1:-}" = "--fast" ]; then  # the tier for work: no slow, Slurm or GPU test, one stream
  shift
  rm -rf "$logs"
  exec .venv/bin/python -m pytest -m "not slow and not slurm and not gpu" "$@"
fi
if [ $# -gt 0 ]; then  # a selection: as asked
  rm -rf "$logs"
  exec .venv/bin/python -m pytest "$@"
fi
# The whole suite, in three streams side by side (`--stream`, tests/conftest.py):
# every Slurm test is in the first (they share its node and its queue, so they
# run one after another), and each stream holds about a third of the time. A
# slow test waits on processes, sockets and Slurm for a good part of its time;
# each stream fills the others' waits (with two, the suite took 45 min 43 s).
# Each process computes on one thread: two streams of torch's default (a thread
# per core, spinning at each barrier) on two cores measured 2x slower than one
# thread each (185 s against 94 s for the agent and bench learner tests side by
# side). vLLM binds its own threads to every core unless told not to.
names=(stream-1 stream-2 stream-3)
pids=()
# Stopped, this script stops its streams: their command lines do not name the
# clone, so a stream left running would go on beside the next run, with its --basetemp.
trap 'kill -TERM "${pids[@]}" 2>/dev/null; rm -rf "$logs"; exit 143' TERM INT HUP
for i in "${!names[@]}"; do
  OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind .venv/bin/python -m pytest -p no:cacheprovider --basetemp="/tmp/sarl-tests-${names[$i]}" --stream $((i + 1)) \
    >"$logs/${names[$i]}" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!names[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "=== tests: ${names[$i]} (exit $rc) ==="
  cat "$logs/${names[$i]}"
  if [ "$rc" -ne 0 ]; then failed+=("${names[$i]}"); fi
done
rm -rf "$logs"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test: failed: $(printf '[%s] ' "${failed[@]}")" >&2
  exit 1
fi
