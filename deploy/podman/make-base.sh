#!/usr/bin/env bash
# Makes the base image for building and running the Dockerfile where no registry can be reached:
# Debian bookworm (minbase, plus passwd for useradd) from debootstrap, imported with podman. The
# root filesystem is cached as a tarball under ~/.cache/praxis-serve, the image in podman's store.
#   usage: deploy/podman/make-base.sh [IMAGE]   (default localhost/praxis-base:bookworm)
#   PRAXIS_DEBIAN_MIRROR  the Debian mirror (default http://deb.debian.org/debian)
set -euo pipefail
IMAGE="${1:-localhost/praxis-base:bookworm}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "$0")" && pwd)/containers.conf}"
CACHE="${PRAXIS_CACHE:-$HOME/.cache/praxis-serve}"
TAR="$CACHE/bookworm-minbase.tar"

podman image exists "$IMAGE" && exit 0
mkdir -p "$CACHE"
if [ ! -s "$TAR" ]; then
  root="$(mktemp -d)"
  trap 'rm -rf "$root"' EXIT
  echo "make-base: debootstrap bookworm into $root"
  debootstrap --variant=minbase --include=passwd,ca-certificates bookworm "$root" \
    "${PRAXIS_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$CACHE/debootstrap.log" 2>&1 ||
    { tail -20 "$CACHE/debootstrap.log"; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -cf "$TAR.tmp" . && mv "$TAR.tmp" "$TAR"
fi
podman import --change 'CMD ["/bin/bash"]' "$TAR" "$IMAGE" >/dev/null
echo "make-base: $IMAGE imported from $TAR"
