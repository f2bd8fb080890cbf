#!/usr/bin/env bash
# Makes a Debian bookworm base image without a registry: debootstrap --variant=minbase with Tessera's
# runtime packages (runtime-packages.txt) included, then `docker import`. The tag carries a hash of the
# package list, so an existing image is reused and a changed list makes a new one.
#   usage: deploy/docker/base.sh [PACKAGE_LIST]   prints the image tag on stdout
#          PACKAGE_LIST default runtime-packages.txt here; build.sh passes the staged one (with what
#          ldd shows the binary needs)
#   env:   DEBIAN_MIRROR (default http://deb.debian.org/debian)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pkgs=$(grep -v '^#' "${1:-$here/runtime-packages.txt}" | sed '/^$/d' | sort -u | paste -sd, -)
tag="tessera-base:bookworm-$(printf '%s' "$pkgs" | sha256sum | cut -c1-12)"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base: $tag already exists" >&2
  echo "$tag"; exit 0
fi
command -v debootstrap >/dev/null || { echo "base: debootstrap is not installed" >&2; exit 1; }
root=$(mktemp -d /tmp/tessera-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base: debootstrap --variant=minbase bookworm (+ $pkgs)" >&2
if ! debootstrap --variant=minbase --include="$pkgs" bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
    >"$root.log" 2>&1; then
  tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1
fi
rm -f "$root.log"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/locale/*
tar -C "$root" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "$tag"
