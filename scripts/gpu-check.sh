#!/usr/bin/env bash
# The device check of issue 14, one command for a lent GPU machine (bare and offline: torch under
# its python3, no Abseil, gRPC, ...): the GPU tests, the GPU benchmark on configs/bench.json and
# configs/praxis-1-reduced.json, and praxis-server on cuda with the reduced Praxis-1 config driven
# by praxis-load at 1 and 8 callers on the bench layout and a small one (15 s each; graphs of 1
# and 8 rows captured at warm-up, its metrics scraped after). Writes into OUTDIR three files:
# summary.json (also printed), gpu_test.xml and logs.txt. At most about 7.5 minutes: every stage
# has its own timeout.
#   scripts/gpu-check.sh OUTDIR          on the device (binaries from gpu-pack/, see gpu-pack.sh)
#   scripts/gpu-check.sh OUTDIR --cpu    the same stages on this CPU machine, device cpu, the tiny
#                                        and bench configs, runs of seconds (CTest gpu_check_cpu)
# PRAXIS_SERVER_FLAGS (space-separated) go to the served praxis-server after the script's own, and
# PRAXIS_CHECK_SERVED_ONLY=1 skips the tests and benchmarks (~1.5 of the ~4 minutes remain), so
# that one device call can compare a server setting, e.g.:
#   bash scripts/gpu-check.sh $OUT/a; PRAXIS_CHECK_SERVED_ONLY=1 \
#     PRAXIS_SERVER_FLAGS=--threads=16 bash scripts/gpu-check.sh $OUT/b
# Binaries come from PRAXIS_PACK_DIR (default gpu-pack/; empty: none) first, then PRAXIS_BUILD_DIR
# (default build/). Libraries: the pack's lib/, then the torch of `python3` (its lib/ and the CUDA
# libraries of its nvidia/ packages), for our binaries only. Exit status 1 if any stage failed;
# the summary says which.
set -uo pipefail
(($# >= 1)) || { echo "usage: $0 OUTDIR [--cpu]" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODE=cuda
[[ "${2:-}" == --cpu ]] && MODE=cpu
mkdir -p "$1" && OUT="$(cd "$1" && pwd)"
PACK="${PRAXIS_PACK_DIR-$ROOT/gpu-pack}"
BUILD="${PRAXIS_BUILD_DIR:-$ROOT/build}"
WORK="$(mktemp -d /tmp/praxis-gpu-check-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
: >"$OUT/logs.txt"
STARTED=$(date +%s)

# Libraries for the packed binaries: the pack's, then the device's torch and its CUDA libraries.
TORCH_LIB="$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))' \
  2>/dev/null || true)"
libs=()
[[ -n "$PACK" && -d "$PACK/lib" ]] && libs+=("$PACK/lib")
if [[ -n "$TORCH_LIB" ]]; then
  libs+=("$TORCH_LIB")
  for d in "$TORCH_LIB"/../../nvidia/*/lib "$TORCH_LIB"/../../nvidia/cu*/lib; do
    [[ -d "$d" ]] && libs+=("$(cd "$d" && pwd)")
  done
fi
# Only our binaries see them (python3 keeps its own libssl, libz, ...).
RUN_LIBS="$(IFS=:; echo "${libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PRAXIS_SOURCE_DIR="$ROOT"

# The path of binary $1 (built under $2 of the build folder): the pack's, else the build's.
bin() {
  if [[ -n "$PACK" && -x "$PACK/bin/$1" ]]; then echo "$PACK/bin/$1"
  elif [[ -x "$BUILD/$2/$1" ]]; then echo "$BUILD/$2/$1"
  else echo "missing-$1"; fi
}
SERVER="$(bin praxis-server server)" LOAD="$(bin praxis-load client)"
GPU_TEST="$(bin gpu_test tests)" GPU_BENCH="$(bin gpu_bench bench)"

# Runs stage $1 with timeout $2 (seconds), the rest its command; stdout to $WORK/$1.out, both
# streams appended to logs.txt; records its exit status in $WORK/rc.$1.
stage() {
  local name=$1 limit=$2; shift 2
  echo "== $name: $* (limit ${limit}s)" | tee -a "$OUT/logs.txt" >&2
  timeout -k 10 "$limit" env LD_LIBRARY_PATH="$RUN_LIBS" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  local rc=$?
  { cat "$WORK/$name.out" "$WORK/$name.err"; echo "== $name: exit $rc"; } >>"$OUT/logs.txt"
  echo "$rc" >"$WORK/rc.$name"
}

if [[ $MODE == cuda ]]; then
  DEVICE=cuda DUR=15s WARM=3s REPEATS=10 LAYOUTS=bench,small SMALL_ROWS=1,8 WARM_ROWS=1,8
  SERVED=("bench 256,30,40,4,2" "small 32,6,8,2,1")  # name and layout of each served load
  BENCHES=("bench configs/bench.json 30" "praxis-1-reduced configs/praxis-1-reduced.json 70")
  SERVED_CONFIG=configs/praxis-1-reduced.json
  LIMITS=(90 75 40)  # seconds: gpu_test, the server's start, each praxis-load run
else
  DEVICE=cpu DUR=3s WARM=1s REPEATS=3 LAYOUTS=small SMALL_ROWS=1 WARM_ROWS=1
  SERVED=("small 16,4,4,2,1")
  BENCHES=("tiny configs/tiny.json 30" "bench configs/bench.json 30")
  SERVED_CONFIG=configs/tiny.json
  LIMITS=(60 60 30)
fi

if [[ -n "${PRAXIS_CHECK_SERVED_ONLY:-}" ]]; then
  BENCHES=()
else
  stage gpu_test "${LIMITS[0]}" env PRAXIS_SERVER_BIN="$SERVER" "$GPU_TEST" \
    --gtest_output="xml:$OUT/gpu_test.xml"
fi
# Each attention mode a stage of its own (with its limit in seconds): a dense step that runs out
# of time or memory leaves the sparse figures standing.
for entry in "${BENCHES[@]}"; do
  read -r name config limit <<<"$entry"
  extra=()
  [[ $MODE == cpu ]] && extra=(--dtype=float32 --threads=1)  # bf16 is emulated on most CPUs
  for attention in sparse dense; do
    stage "bench_${name}_$attention" "$limit" "$GPU_BENCH" --device="$DEVICE" \
      --config="$ROOT/$config" --attention="$attention" --layouts="$LAYOUTS" \
      --small_rows="$SMALL_ROWS" --repeats="$REPEATS" "${extra[@]}"
  done
done

# The real server on $DEVICE, on loopback, then praxis-load at 1 and 8 callers on each layout of
# SERVED (all warmed up first); the summary reads SERVED back from served_layouts.txt.
serve_and_load() {
  local port_file="$WORK/port.json" port="" waited=0 entry name mix warmup=""
  printf '%s\n' "${SERVED[@]}" >"$WORK/served_layouts.txt"
  for entry in "${SERVED[@]}"; do warmup+="${warmup:+;}${entry#* }"; done
  env LD_LIBRARY_PATH="$RUN_LIBS" "$SERVER" --device="$DEVICE" --config="$ROOT/$SERVED_CONFIG" \
    --host=127.0.0.1 --port=0 --metrics_host=127.0.0.1 --metrics_port=0 \
    --port_file="$port_file" --warmup="$warmup" --warmup_rows="$WARM_ROWS" --max_request_cost=1e7 \
    ${PRAXIS_SERVER_FLAGS:-} >"$WORK/server.log" 2>&1 &
  local pid=$!
  while [[ ! -s "$port_file" ]] && kill -0 "$pid" 2>/dev/null && ((waited < LIMITS[1] * 10)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  port="$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["port"])' "$port_file" \
    2>/dev/null)"
  local metrics_port
  metrics_port="$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["metrics_port"])' \
    "$port_file" 2>/dev/null)"
  if [[ -n "$port" ]]; then echo 0; else echo 1; fi >"$WORK/rc.server_start"
  if [[ -n "$port" ]]; then
    for entry in "${SERVED[@]}"; do
      read -r name mix <<<"$entry"
      for n in 1 8; do
        stage "load_${name}_$n" "${LIMITS[2]}" "$LOAD" --address="127.0.0.1:$port" \
          --concurrency="$n" --duration="$DUR" --warmup="$WARM" --mix="$mix" \
          --json="$WORK/load_${name}_$n.json"
      done
    done
    # The server's metrics after the load (the summary keeps the graph cache's counters and the
    # batches' rows, queue and compute sums; logs.txt all of them).
    python3 -c 'import sys,urllib.request as u;print(u.urlopen(sys.argv[1],timeout=10).read().decode())' \
      "http://127.0.0.1:$metrics_port/metrics" >"$WORK/metrics.txt" 2>>"$OUT/logs.txt"
    { echo "== metrics"; grep -v '^#' "$WORK/metrics.txt"; } >>"$OUT/logs.txt"
  fi
  kill -TERM "$pid" 2>/dev/null
  timeout 60 tail --pid="$pid" -f /dev/null
  wait "$pid"
  echo $? >"$WORK/rc.server_exit"
  { echo "== praxis-server"; cat "$WORK/server.log"; } >>"$OUT/logs.txt"
}
serve_and_load

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  >"$WORK/nvidia-smi.txt" 2>/dev/null || true
python3 "$ROOT/scripts/gpu_check_summary.py" --mode "$MODE" --work "$WORK" --out "$OUT" \
  --root "$ROOT" --pack "$PACK" --elapsed "$(($(date +%s) - STARTED))" \
  --server "$SERVER" --config "$SERVED_CONFIG"
