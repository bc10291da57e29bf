#!/usr/bin/env bash
# Starts praxis-server on the embedded default (tiny) model; extra arguments go to the server
# (e.g. --port=6000, --checkpoint=DIR, --flagfile=FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec "${PRAXIS_BUILD_DIR:-build}/server/praxis-server" "$@"
