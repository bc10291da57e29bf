#!/usr/bin/env bash
# Configures and builds praxis-serve into build/ (2 parallel jobs, as the CI machines have 2 cores).
# Arguments name targets to build (the image builds only praxis-server praxis-cli praxis-load);
# none builds everything. ccache, when installed, caches compiles across builds.
#   PRAXIS_BUILD_DIR  build folder (default build/)   PRAXIS_JOBS  parallel jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PRAXIS_VENV:-$HOME/.cache/praxis-serve/venv}"
BUILD="${PRAXIS_BUILD_DIR:-build}"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths relative to the checkout and no working directory in the hash: a fresh clone elsewhere,
  # or the image's build stage with the cache mounted, reuses what an earlier build compiled.
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
fi
# LibTorch's CMake enables CUDA: nvcc from PATH, else from the toolkit's standard place (a CUDA
# devel image puts it on PATH; a bare base with the toolkit mounted does not).
cuda=()
command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] ||
  cuda=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DPRAXIS_PYTHON="$VENV/bin/python" "${launcher[@]}" "${cuda[@]}" -Wno-dev \
  >"$BUILD/cmake.log" 2>&1 || { cat "$BUILD/cmake.log"; exit 1; }
targets=()
(($#)) && targets=(--target "$@")
cmake --build "$BUILD" -j "${PRAXIS_JOBS:-2}" "${targets[@]}"
