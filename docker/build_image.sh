#!/usr/bin/env bash
# Builds the stages' image (docker/Dockerfile) on a machine without an image registry.
#
# Usage: docker/build_image.sh [IMAGE]          (IMAGE defaults to $IMAGE or nightly-trainer:latest)
# Environment:
#   BASE_IMAGE  base to build on (default nightly-trainer/base:bookworm, made by
#               docker/make_base_image.sh when missing; python:3.11-slim needs a registry)
#   EXTRA_CA_DIR  folder of extra CA certificates pip must trust inside the build
#               (default /usr/local/share/ca-certificates, where Debian keeps locally added CAs)
#   DOCKER_BUILD_ARGS  extra arguments for `docker build` (e.g. --network host, --no-cache)
#
# The build container uses the default bridge network: it reaches PyPI like the host does.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${1:-${IMAGE:-nightly-trainer:latest}}"
BASE_IMAGE="${BASE_IMAGE:-nightly-trainer/base:bookworm}"
EXTRA_CA_DIR="${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"

die() { echo "build_image: $*" >&2; exit 1; }

docker info >/dev/null 2>&1 || die "cannot reach the Docker engine ('docker info' fails); start dockerd."
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  if [[ "$BASE_IMAGE" == nightly-trainer/base:* ]]; then
    "$REPO_ROOT/docker/make_base_image.sh" "$BASE_IMAGE"
  else
    echo "build_image: $BASE_IMAGE is not local; docker build will try to pull it." >&2
  fi
fi

# A TLS-inspecting proxy's CA, trusted by the host, must be trusted by pip in the build too.
ca_dir="$REPO_ROOT/docker/build-ca"
rm -f "$ca_dir"/*.crt
if compgen -G "$EXTRA_CA_DIR/*.crt" >/dev/null; then
  cp "$EXTRA_CA_DIR"/*.crt "$ca_dir"/
fi

start=$SECONDS
# shellcheck disable=SC2086  # DOCKER_BUILD_ARGS is a list of words on purpose
docker build ${DOCKER_BUILD_ARGS:-} \
  --build-arg BASE_IMAGE="$BASE_IMAGE" \
  -f "$REPO_ROOT/docker/Dockerfile" -t "$IMAGE" "$REPO_ROOT" \
  || die "docker build of $IMAGE failed (see above); with no network to PyPI, nothing can be installed."
echo "build_image: built $IMAGE on $BASE_IMAGE in $((SECONDS - start))s" >&2
