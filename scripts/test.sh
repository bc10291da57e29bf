#!/usr/bin/env bash
# The one command that installs what is missing, builds, and runs every test (C++ and Python).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir "${PRAXIS_BUILD_DIR:-build}" -j "${PRAXIS_JOBS:-2}" --output-on-failure "$@"
