#!/usr/bin/env bash
# Gathers into DIR (default gpu-pack/, git-ignored; at most 64 MiB, what travels to a lent GPU
# machine beside the working tree) what that bare offline machine lacks for scripts/gpu-check.sh:
# the stripped binaries praxis-server, praxis-load, gpu_test and gpu_bench, built here against the
# venv's torch (the device's version, 2.11.0+cu130), and their shared libraries except torch's,
# CUDA's and the system's (glibc, libstdc++, libgcc_s), which the device has. gpu-check.sh puts
# DIR/lib, then the device's torch/lib, on LD_LIBRARY_PATH. Prints the folder's size and files.
#   scripts/gpu-pack.sh [DIR]      (builds the four targets first; PRAXIS_JOBS as build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-gpu-pack}"
BUILD="${PRAXIS_BUILD_DIR:-build}"
LIMIT_BYTES=$((64 << 20))
bash scripts/build.sh praxis-server praxis-load gpu_test gpu_bench
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
for b in server/praxis-server client/praxis-load tests/gpu_test bench/gpu_bench; do
  strip --strip-all -o "$DIR/bin/$(basename "$b")" "$BUILD/$b"
done

# Torch's and CUDA's libraries come from the device's torch; glibc, libstdc++ and libgcc_s from
# its system (older here, so what was built here runs there).
PYTHON="${PRAXIS_VENV:-$HOME/.cache/praxis-serve/venv}/bin/python"
TORCH_SITE="$("$PYTHON" -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')"
ldd "$DIR"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case "$path" in "$TORCH_SITE"/* | /usr/local/cuda*) continue ;; esac
    case "$name" in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libutil.so.* | \
        libresolv.so.* | ld-linux* | libstdc++.so.* | libgcc_s.so.* | libcuda.so.*) continue ;;
    esac
    strip --strip-unneeded -o "$DIR/lib/$name" "$path"
  done

# What the binaries were built from and against, and what they need of the device's system.
needs="$(objdump -T "$DIR"/bin/* "$DIR"/lib/* | grep -oE 'GLIBC(XX)?_[0-9.]+' | sort -uV |
  awk -F_ '{max[$1] = $0} END {print max["GLIBC"], max["GLIBCXX"]}')"
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)"
  echo "built $(date -u +%FT%TZ) against torch" \
    "$("$PYTHON" -c 'import torch;print(torch.__version__)')"
  echo "needs $needs"
} >"$DIR/VERSION"

size=$(du -sb "$DIR" | cut -f1)
(cd "$DIR" && find . -type f -printf '%10s  %p\n' | sort -k2)
echo "$DIR: $size bytes ($((size >> 20)) MiB) of $((LIMIT_BYTES >> 20)) MiB;" \
  "$(tr '\n' ';' <"$DIR/VERSION")"
((size <= LIMIT_BYTES)) || { echo "$DIR is over 64 MiB: it cannot travel" >&2; exit 1; }
