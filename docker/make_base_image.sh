#!/usr/bin/env bash
# Builds the offline base image (Debian bookworm + Python 3.11) without any image registry.
#
# The Docker engine on CI starts empty and cannot pull `python:3.11-slim`, but it can reach
# Debian's mirrors: debootstrap a minimal rootfs, then `docker import` it. Bookworm's python3
# is 3.11, the version requirements.lock is pinned for.
#
# Usage: docker/make_base_image.sh [IMAGE]      (root; IMAGE defaults to $BASE_IMAGE or below)
# Environment:
#   BASE_IMAGE     image name to create        (default nightly-trainer/base:bookworm)
#   DEBIAN_MIRROR  Debian mirror               (default http://deb.debian.org/debian)
#   DEBIAN_SUITE   Debian suite                (default bookworm)
#   CACHE_DIR      where the rootfs tarball is kept between runs (default <repo>/.cache/docker)
#   FORCE=1        rebuild the tarball and the image even if they exist
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${1:-${BASE_IMAGE:-nightly-trainer/base:bookworm}}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${DEBIAN_SUITE:-bookworm}"
CACHE_DIR="${CACHE_DIR:-$REPO_ROOT/.cache/docker}"
PACKAGES="python3,python3-venv,ca-certificates"
TARBALL="$CACHE_DIR/base-$SUITE-$(dpkg --print-architecture 2>/dev/null || echo amd64).tar"

die() { echo "make_base_image: $*" >&2; exit 1; }
log() { echo "make_base_image: $*" >&2; }

command -v docker >/dev/null || die "docker is not installed; install docker.io (apt-get install docker.io)."
docker info >/dev/null 2>&1 || die "cannot reach the Docker engine ('docker info' fails); start dockerd or check DOCKER_HOST."

if [[ "${FORCE:-0}" != 1 ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "$IMAGE already exists; nothing to do (FORCE=1 rebuilds it)."
  exit 0
fi

start=$SECONDS
if [[ "${FORCE:-0}" == 1 || ! -s "$TARBALL" ]]; then
  [[ "$(id -u)" == 0 ]] || die "debootstrap needs root; rerun as root (sudo $0)."
  mkdir -p "$CACHE_DIR"
  if ! command -v debootstrap >/dev/null; then
    # Unattended (CI on a fresh machine): install it from Debian like everything else here.
    command -v apt-get >/dev/null \
      || die "debootstrap is not installed and there is no apt-get; install debootstrap."
    log "installing debootstrap with apt-get"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; } \
      > "$CACHE_DIR/apt-get.log" 2>&1 \
      || die "apt-get install debootstrap failed; see $CACHE_DIR/apt-get.log."
  fi
  rootfs="$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")"
  trap 'rm -rf "$rootfs" "$TARBALL.tmp"' EXIT
  log "debootstrap $SUITE ($PACKAGES) from $MIRROR into $rootfs"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" \
    > "$CACHE_DIR/debootstrap.log" 2>&1 \
    || die "debootstrap failed; see $CACHE_DIR/debootstrap.log (is $MIRROR reachable?)."
  # Same clean-up as the official Debian images: no package lists or caches in the image.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
  tar --numeric-owner -C "$rootfs" -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
  rm -rf "$rootfs"
  trap - EXIT
  log "rootfs tarball written to $TARBALL ($((SECONDS - start))s)"
else
  log "reusing cached rootfs tarball $TARBALL (delete it or set FORCE=1 to redo debootstrap)"
fi

docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' \
  --message "debootstrap --variant=minbase $SUITE + $PACKAGES" \
  "$TARBALL" "$IMAGE" >/dev/null \
  || die "docker import of $TARBALL failed; delete the tarball and rerun."
docker run --rm "$IMAGE" python3 -c 'import ensurepip, ssl, sys; assert sys.version_info[:2] == (3, 11)' \
  || die "$IMAGE has no working Python 3.11 with venv support; rerun with FORCE=1."
log "built $IMAGE in $((SECONDS - start))s"
