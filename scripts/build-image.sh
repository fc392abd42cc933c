#!/usr/bin/env bash
# Build the sandbox runtime image on a machine with Apptainer (a cluster login
# or build node): containers/sandbox.def -> containers/sandbox.sif.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v apptainer >/dev/null || { echo "build-image: apptainer is not installed here" >&2; exit 1; }
apptainer build --fakeroot containers/sandbox.sif containers/sandbox.def
