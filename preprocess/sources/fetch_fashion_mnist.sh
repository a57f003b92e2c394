#!/usr/bin/env bash
# Puts the four Fashion-MNIST IDX files into DEST and checks them against the sums this
# project records (preprocess/sources/fashion_mnist.sha256). Offline: the files come from
# Debian's dataset-fashion-mnist package, never from the internet.
set -euo pipefail
dest=${1:?usage: fetch_fashion_mnist.sh DEST}
here=$(cd "$(dirname "$0")" && pwd)
sums="$here/fashion_mnist.sha256"
system_dir=/usr/share/datasets/fashion-mnist

mkdir -p "$dest"
if (cd "$dest" && sha256sum --quiet -c "$sums") >/dev/null 2>&1; then
  exit 0
fi
if [ -f "$system_dir/train-images-idx3-ubyte.gz" ]; then
  cp "$system_dir"/*.gz "$dest"/
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  if ! (cd "$work" && apt-get download dataset-fashion-mnist >/dev/null 2>&1); then
    # A fresh machine has no package lists yet.
    apt-get update -qq >/dev/null 2>&1 || true
    (cd "$work" && apt-get download dataset-fashion-mnist >/dev/null) || {
      echo "error: could not download Debian package dataset-fashion-mnist (apt-get download failed)" >&2
      exit 1
    }
  fi
  dpkg-deb -x "$work"/dataset-fashion-mnist_*.deb "$work/x"
  cp "$work/x$system_dir"/*.gz "$dest"/
fi
(cd "$dest" && sha256sum --quiet -c "$sums") || {
  echo "error: Fashion-MNIST files in $dest do not match $sums" >&2
  exit 1
}
echo "Fashion-MNIST source files ready in $dest"
