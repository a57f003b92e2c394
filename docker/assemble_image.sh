#!/usr/bin/env bash
# Builds the stages' image with docker/Dockerfile, installing the lock's packages outside
# Docker's layered build: for engines that store layers with fuse-overlayfs (Docker in a VM or
# a container, rootless Docker), where every file a build step writes goes through FUSE.
#
# 1. docker/build_image.sh builds the Dockerfile, every step of it, from a copy of the build
#    context whose requirements.lock holds only the project's build backend (setuptools): the
#    recipe image IMAGE-recipe, with the venv, the user, the project and the entrypoint.
# 2. Its files are exported into a folder, where uv installs the whole lock into /opt/venv
#    (pip is the recipe's) as the Dockerfile's step does (in a chroot, in a mount namespace of
#    its own, from `make setup`'s cache; anything the cache lacks comes from PyPI). The cache is
#    hard-linked into the folder where both are on one file system, so uv links the packages'
#    files into the venv as `make setup` does instead of copying 2 GB (through a bind mount,
#    the other way, link() fails across mounts).
# 3. `docker import` loads the folder as IMAGE, one layer, with the recipe image's settings
#    (ENV, WORKDIR, ENTRYPOINT, CMD, USER).
#
# From scratch on a 2-core VM whose engine uses fuse-overlayfs, `docker build` of the Dockerfile
# took 4 min 17 s and 330 CPU-s, this 2 min 37 s and 191 CPU-s (docs/containers.md).
#
# Usage: docker/assemble_image.sh [IMAGE]   (root; IMAGE defaults to $IMAGE or nightly-trainer:latest)
# Environment:
#   BASE_IMAGE    base to build on (default nightly-trainer/base:bookworm, made by
#                 docker/make_base_image.sh when missing)
#   UV            the uv to install with (default .venv/bin/uv: run `make setup` first)
#   HOST_VENV     the venv whose bytecode the image reuses where valid (default .venv)
#   EXTRA_CA_DIR  folder of extra CA certificates uv must trust while it installs, as for
#                 docker/build_image.sh (default /usr/local/share/ca-certificates)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${1:-${IMAGE:-nightly-trainer:latest}}"
RECIPE_IMAGE="$IMAGE-recipe"
export BASE_IMAGE="${BASE_IMAGE:-nightly-trainer/base:bookworm}"
UV="${UV:-$REPO_ROOT/.venv/bin/uv}"
HOST_VENV="${HOST_VENV:-$REPO_ROOT/.venv}"
EXTRA_CA_DIR="${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"

die() { echo "assemble_image: $*" >&2; exit 1; }

[[ "$(id -u)" == 0 ]] || die "the image's files are owned by root and trainer: rerun as root (sudo $0)."
command -v unshare >/dev/null || die "unshare (util-linux) is not installed."
[[ -x "$UV" ]] || die "no uv at $UV: run 'make setup' first, or set UV."
backend="$(grep -E '^setuptools==' "$REPO_ROOT/requirements.lock")" \
  || die "requirements.lock pins no setuptools, the project's build backend."

start=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/assemble-image.XXXXXX")"
container=""
cleanup() {
  [[ -z "$container" ]] || docker rm -f "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The recipe image: the build context as .dockerignore lets it in, with a one-line lock.
context="$work/context"
mkdir -p "$context/docker"
mapfile -t allowed < <(sed -n 's/^!//p' "$REPO_ROOT/.dockerignore")
present=()
for path in "${allowed[@]}"; do
  [[ ! -e "$REPO_ROOT/$path" ]] || present+=("${path%/}")
done
tar -C "$REPO_ROOT" --exclude=__pycache__ --exclude='*.pyc' -cf - "${present[@]}" \
  .dockerignore docker/Dockerfile docker/build_image.sh | tar -C "$context" -xf -
echo "$backend" >"$context/requirements.lock"
bash "$context/docker/build_image.sh" "$RECIPE_IMAGE" \
  || die "docker/build_image.sh failed on the recipe (see above)."

# 2. Its files, and the lock installed into them.
rootfs="$work/rootfs"
mkdir -p "$rootfs"
container="$(docker create "$RECIPE_IMAGE" true)"
docker export "$container" | tar -C "$rootfs" --numeric-owner -xpf - \
  || die "exporting $RECIPE_IMAGE's files failed."
docker rm "$container" >/dev/null
container=""
# Docker's marker of a running container is no file of an image.
rm -f "$rootfs/.dockerenv"

mkdir -p "$rootfs/tmp/build"
cp "$REPO_ROOT/requirements.lock" "$UV" "$rootfs/tmp/build/"
cache="$("$UV" cache dir)"
mkdir -p "$cache"
if [[ "$(stat -c %d "$cache")" == "$(stat -c %d "$rootfs")" ]] \
  && cp -al "$cache" "$rootfs/tmp/uv-cache" 2>/dev/null; then
  bind_cache=""
else
  rm -rf "$rootfs/tmp/uv-cache"
  mkdir -p "$rootfs/tmp/uv-cache"
  bind_cache="mount --bind ${cache@Q} ${rootfs@Q}/tmp/uv-cache"
fi
if compgen -G "$EXTRA_CA_DIR/*.crt" >/dev/null; then
  cp "$EXTRA_CA_DIR"/*.crt "$rootfs/tmp/build/"
fi
# uv asks the host's name server while it runs.
cp "$rootfs/etc/resolv.conf" "$work/resolv.conf"
cp -L /etc/resolv.conf "$rootfs/etc/resolv.conf"
# The environment the Dockerfile's steps run in: the recipe image's.
mapfile -t image_env < <(docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' \
  "$RECIPE_IMAGE" | sed '/^$/d')

# Runs COMMAND... in the image's files as the Dockerfile's steps run (chroot, the recipe's
# environment) with /proc, /dev and the one more mount MOUNT (a command line, or ""), in a mount
# namespace of its own: the mounts end with it, however the command ends.
in_image() {  # in_image MOUNT COMMAND...
  local mount="$1"
  shift
  cat >"$work/in_image.sh" <<EOF
set -eu
mount -t proc proc ${rootfs@Q}/proc
mount --rbind /dev ${rootfs@Q}/dev
$mount
chroot ${rootfs@Q} env -i HOME=/root ${image_env[*]@Q} ${*@Q}
EOF
  unshare --mount --propagation private bash "$work/in_image.sh"
}

install='
  if ls /tmp/build/*.crt >/dev/null 2>&1; then
    cat "$(python -m pip._vendor.certifi)" /tmp/build/*.crt > /tmp/build/ca.pem
    export SSL_CERT_FILE=/tmp/build/ca.pem
  fi
  /tmp/build/uv pip install -q --python /opt/venv/bin/python --cache-dir /tmp/uv-cache \
    --no-deps -r /tmp/build/requirements.lock
  python -c "import importlib.util, sys, sysconfig
print(sysconfig.get_paths()[\"purelib\"], importlib.util.MAGIC_NUMBER.hex(), sys.implementation.cache_tag)" \
    > /tmp/build/python.txt
  rm -rf "$(cut -d" " -f1 /tmp/build/python.txt)/tensorflow/include"
'
in_image "$bind_cache" /bin/sh -eu -c "$install" \
  || die "installing requirements.lock into the image's files failed (see above)."

# The bytecode, as the Dockerfile's `uv pip install --compile-bytecode` leaves it: each module's
# .pyc from `make setup`'s venv where it is valid (docker/reuse_bytecode.py), the rest compiled
# by the image's Python (all of it, in parallel, when little could be reused).
read -r purelib magic tag < "$rootfs/tmp/build/python.txt"
host_purelib="$("$HOST_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  2>/dev/null)" || host_purelib=""
compile=(python -m compileall -q -j 0 "$purelib")
if [[ -d "$host_purelib" ]]; then
  python3 "$REPO_ROOT/docker/reuse_bytecode.py" "$host_purelib" "$rootfs" "$purelib" "$magic" \
    "$tag" "$rootfs/tmp/build/missing.txt" >&2 \
    || die "linking $HOST_VENV's bytecode into the image's files failed (see above)."
  if (($(wc -l <"$rootfs/tmp/build/missing.txt") <= 500)); then
    compile=(python -m compileall -q -i /tmp/build/missing.txt)
  fi
fi
in_image "" "${compile[@]}" || die "compiling the image's bytecode failed (see above)."
cp "$work/resolv.conf" "$rootfs/etc/resolv.conf"
rm -rf "$rootfs/tmp/build" "$rootfs/tmp/uv-cache" "$rootfs/root/.cache"

# 3. One layer, with the recipe image's settings.
changes=()
for pair in "${image_env[@]}"; do
  changes+=(--change "ENV ${pair%%=*}=\"${pair#*=}\"")
done
for field in WorkingDir:WORKDIR User:USER; do
  value="$(docker image inspect -f "{{.Config.${field%%:*}}}" "$RECIPE_IMAGE")"
  [[ -z "$value" ]] || changes+=(--change "${field#*:} $value")
done
for field in Entrypoint:ENTRYPOINT Cmd:CMD; do
  value="$(docker image inspect -f "{{json .Config.${field%%:*}}}" "$RECIPE_IMAGE")"
  [[ "$value" == null ]] || changes+=(--change "${field#*:} $value")
done
tar -C "$rootfs" --numeric-owner -cf - . \
  | docker import "${changes[@]}" --message "docker/assemble_image.sh: $RECIPE_IMAGE + requirements.lock" \
    - "$IMAGE" >/dev/null \
  || die "docker import of the assembled files failed."
echo "assemble_image: assembled $IMAGE in $((SECONDS - start))s" >&2
