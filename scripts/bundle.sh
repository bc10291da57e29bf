#!/usr/bin/env bash
# Installs the server and the clients, with every shared library they load, into PREFIX/bin and
# PREFIX/lib: what the image's runtime stage copies. Libraries are found with ldd, plus the ones
# LibTorch and cuDNN open at run time (torch/lib and the wheel's nvidia/*/lib), which ldd cannot see.
# glibc and the GPU driver (mounted into the container by the NVIDIA runtime) are left out.
#   usage: scripts/bundle.sh PREFIX   (PRAXIS_BUILD_DIR, PRAXIS_VENV as for build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX="${1:?usage: scripts/bundle.sh PREFIX}"
VENV="${PRAXIS_VENV:-$HOME/.cache/praxis-serve/venv}"
BUILD="${PRAXIS_BUILD_DIR:-build}"
BINS=("$BUILD/server/praxis-server" "$BUILD/client/praxis-cli" "$BUILD/client/praxis-load")
# Provided by the base image (glibc) or by the node (the driver): never bundled.
SYSTEM='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libcuda|libnvidia-ml)\.so'

mkdir -p "$PREFIX/bin" "$PREFIX/lib"
for b in "${BINS[@]}"; do
  install -m 0755 "$b" "$PREFIX/bin/"
  strip --strip-debug "$PREFIX/bin/$(basename "$b")"
done

torch_dir="$("$VENV/bin/python" -c \
  'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])')"
site="$(dirname "$torch_dir")"
find "$torch_dir/lib" "$site/nvidia" -type f -name 'lib*.so*' ! -name 'libtorch_python*' -print0 |
  xargs -0 cp -L -t "$PREFIX/lib"

missing=0
while read -r name _ path _; do
  [[ "$name" =~ $SYSTEM ]] && continue
  if [[ "$path" == "not" || -z "$path" ]]; then
    echo "bundle: $name: not found" >&2; missing=1; continue
  fi
  [ -e "$PREFIX/lib/$name" ] || cp -L "$path" "$PREFIX/lib/$name"
done < <(LD_LIBRARY_PATH="$PREFIX/lib" ldd "${BINS[@]}" | awk '/=>/ {print $1, $2, $3, $4}' | sort -u)
((missing == 0)) || exit 1
echo "bundle: $PREFIX: $(ls "$PREFIX/bin" | wc -l) programs, $(ls "$PREFIX/lib" | wc -l) libraries, $(du -sh "$PREFIX" | cut -f1)"
