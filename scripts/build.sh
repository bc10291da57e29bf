#!/usr/bin/env bash
# Configures and builds praxis-serve into build/ (2 parallel jobs, as the CI machines have 2 cores).
#   PRAXIS_BUILD_DIR  build folder (default build/)   PRAXIS_JOBS  parallel jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PRAXIS_VENV:-$HOME/.cache/praxis-serve/venv}"
BUILD="${PRAXIS_BUILD_DIR:-build}"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DPRAXIS_PYTHON="$VENV/bin/python" -Wno-dev >"$BUILD/cmake.log" 2>&1 ||
  { cat "$BUILD/cmake.log"; exit 1; }
cmake --build "$BUILD" -j "${PRAXIS_JOBS:-2}"
