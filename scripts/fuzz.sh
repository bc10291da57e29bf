#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz: builds them with clang + ASan/UBSan into their own build
# folder (the main build is gcc; the sanitizers and libFuzzer need clang), then runs one for a
# bounded time from its committed seed corpus. The test command runs both through CTest
# (tests/CMakeLists.txt: fuzz_build, then fuzz_<target>).
#   scripts/fuzz.sh build                       configure and build every fuzz target
#   scripts/fuzz.sh run TARGET [SECONDS] [ARGS] fuzz TARGET (step_request, config, safetensors) for
#                                               SECONDS (default PRAXIS_FUZZ_SECONDS or 60); extra
#                                               ARGS go to libFuzzer (e.g. -jobs=2, -runs=N)
# A crash, sanitizer report, leak, timeout or out-of-memory fails the run; the input is saved under
# build-fuzz/artifacts/ and its path printed. New inputs go to build-fuzz/corpus/TARGET (kept
# between runs); the committed seeds in tests/fuzz/corpus/TARGET are only read.
#   PRAXIS_FUZZ_BUILD_DIR (default build-fuzz)  PRAXIS_JOBS (default 2)  PRAXIS_VENV as for build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PRAXIS_VENV:-$HOME/.cache/praxis-serve/venv}"
BUILD="${PRAXIS_FUZZ_BUILD_DIR:-build-fuzz}"
CLANG_VERSION=14

build() {
  local launcher=()
  if command -v ccache >/dev/null; then
    # As in build.sh: paths relative to the checkout, so another clone reuses the cache.
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  fi
  local cuda=()
  command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] ||
    cuda=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  mkdir -p "$BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DPRAXIS_FUZZ=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="clang++-$CLANG_VERSION" -DCMAKE_C_COMPILER="clang-$CLANG_VERSION" \
    -DPRAXIS_PYTHON="$VENV/bin/python" "${launcher[@]}" "${cuda[@]}" -Wno-dev \
    >"$BUILD/cmake.log" 2>&1 || { cat "$BUILD/cmake.log"; exit 1; }
  cmake --build "$BUILD" -j "${PRAXIS_JOBS:-2}" \
    --target step_request_fuzzer config_fuzzer safetensors_fuzzer
}

run() {
  local target="${1:?usage: scripts/fuzz.sh run TARGET [SECONDS] [ARGS]}"
  local seconds="${2:-${PRAXIS_FUZZ_SECONDS:-60}}"
  shift $(($# < 2 ? $# : 2))
  local bin="$BUILD/tests/fuzz/${target}_fuzzer"
  [ -x "$bin" ] || { echo "fuzz: $bin not built (scripts/fuzz.sh build)" >&2; exit 1; }
  local corpus="$BUILD/corpus/$target" artifacts="$PWD/$BUILD/artifacts/$target"
  mkdir -p "$corpus" "$artifacts"
  local dict=() log="$BUILD/fuzz-$target.log"
  [ -f "tests/fuzz/$target.dict" ] && dict=(-dict="tests/fuzz/$target.dict")
  # Both sanitizers stop at the first error, so that libFuzzer saves the input. LeakSanitizer stays
  # on: a parser that leaks per input would grow the server per request (LibTorch and protobuf
  # report nothing at exit here). UBSan prints a stack for each report.
  local rc=0 start=$SECONDS
  ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:symbolize=1}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    "$bin" "$corpus" "tests/fuzz/corpus/$target" -max_total_time="$seconds" -timeout=25 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" "$@" >"$log" 2>&1 || rc=$?
  local execs rate
  execs="$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -1)"
  rate="$(awk '/stat::average_exec_per_sec/ {print $2}' "$log" | tail -1)"
  echo "fuzz $target: ${execs:-?} executions in $((SECONDS - start)) s, ${rate:-?} exec/s," \
    "corpus $(ls "$corpus" | wc -l) new + $(ls "tests/fuzz/corpus/$target" | wc -l) seeds"
  if ((rc != 0)); then
    tail -n 80 "$log"
    local found
    found="$(ls -t "$artifacts" 2>/dev/null | head -1)"
    echo "fuzz $target: FAILED (exit $rc); full log $PWD/$log"
    [ -n "$found" ] && echo "fuzz $target: input saved at $artifacts/$found" \
      "(replay: $PWD/$bin $artifacts/$found)"
    exit 1
  fi
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
