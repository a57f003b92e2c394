#!/usr/bin/env bash
# Builds the offline base image (Debian bookworm + Python 3.11) without any image registry.
#
# The Docker engine on CI starts empty and cannot pull `python:3.11-slim`, but it can reach
# Debian's mirrors: mmdebstrap writes a minimal rootfs tarball, then `docker import` loads it.
# Bookworm's python3 is 3.11, the version requirements.lock is pinned for. mmdebstrap resolves
# and unpacks with apt, in about half debootstrap's time and CPU for the same packages.
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
  [[ "$(id -u)" == 0 ]] || die "mmdebstrap needs root here; rerun as root (sudo $0)."
  mkdir -p "$CACHE_DIR"
  hooks=/usr/share/mmdebstrap/hooks/merged-usr
  if ! command -v mmdebstrap >/dev/null || [[ ! -d "$hooks" ]]; then
    # Unattended (CI on a fresh machine): install it from Debian like everything else here.
    command -v apt-get >/dev/null \
      || die "mmdebstrap is not installed and there is no apt-get; install mmdebstrap."
    log "installing mmdebstrap with apt-get"
    # Another install may hold dpkg's lock (a test installing Chromium beside the Docker tests):
    # apt waits for it instead of failing at once.
    apt_get=(apt-get -o DPkg::Lock::Timeout=600)
    { "${apt_get[@]}" update -q \
        && DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y -q mmdebstrap; } \
      > "$CACHE_DIR/apt-get.log" 2>&1 \
      || die "apt-get install mmdebstrap failed; see $CACHE_DIR/apt-get.log."
  fi
  trap 'rm -f "$TARBALL.tmp"' EXIT
  log "mmdebstrap $SUITE ($PACKAGES) from $MIRROR into $TARBALL"
  # The merged-usr hook gives bookworm's merged /usr as debootstrap does (usr-is-merged, not
  # the usrmerge package and the Perl it pulls in). mmdebstrap leaves out package lists and
  # caches, as the official Debian images do; /dev is Docker's own at run time.
  mmdebstrap --variant=minbase --hook-dir="$hooks" --include="$PACKAGES" \
    --skip=output/dev --format=tar "$SUITE" "$TARBALL.tmp" "$MIRROR" \
    > "$CACHE_DIR/mmdebstrap.log" 2>&1 \
    || die "mmdebstrap failed; see $CACHE_DIR/mmdebstrap.log (is $MIRROR reachable?)."
  mv "$TARBALL.tmp" "$TARBALL"
  trap - EXIT
  log "rootfs tarball written to $TARBALL ($((SECONDS - start))s)"
else
  log "reusing cached rootfs tarball $TARBALL (delete it or set FORCE=1 to redo mmdebstrap)"
fi

docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' \
  --message "mmdebstrap --variant=minbase $SUITE + $PACKAGES" \
  "$TARBALL" "$IMAGE" >/dev/null \
  || die "docker import of $TARBALL failed; delete the tarball and rerun."
docker run --rm "$IMAGE" python3 -c 'import ensurepip, ssl, sys; assert sys.version_info[:2] == (3, 11)' \
  || die "$IMAGE has no working Python 3.11 with venv support; rerun with FORCE=1."
log "built $IMAGE in $((SECONDS - start))s"
