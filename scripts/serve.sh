#!/usr/bin/env bash
# Starts praxis-server on the embedded default (tiny) model; extra arguments go to the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BIN="${PRAXIS_BUILD_DIR:-build}/server/praxis-server"
if [ ! -x "$BIN" ]; then
  echo "praxis-server: not yet built (the server lands with issue 4); the mask tool is at build/tools/praxis-masks" >&2
  exit 1
fi
exec "$BIN" "$@"
