#!/usr/bin/env bash
# Builds the Tessera image from an existing build (no compiler in docker, no registry):
#   deploy/docker/build.sh [TAG]        (default tessera:latest)
#   env: TESSERA_BIN (default build/server/tessera), TESSERA_MODEL_DIR (models to bake in),
#        TESSERA_BASE (a Debian bookworm image; default: the debootstrap one base.sh makes with the
#        packages the binary needs),
#        TESSERA_TARGET (cpu | cuda; default: what the binary links)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tag=${1:-tessera:latest}
ctx=$(mktemp -d /tmp/tessera-image.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
target=$("$here/stage.sh" "$ctx" "${TESSERA_BIN:-$here/../../build/server/tessera}")
target=${TESSERA_TARGET:-$target}
base=${TESSERA_BASE:-$("$here/base.sh" "$ctx/runtime-packages.txt")}
# For deploy/check.sh: what was built on what.
[ -z "${TESSERA_BUILD_INFO:-}" ] || printf 'base=%s\ntarget=%s\n' "$base" "$target" > "$TESSERA_BUILD_INFO"
echo "build: $tag (target $target, base $base)" >&2
# The classic builder: dockerd 20.10 from Debian has no buildx plugin next to it.
DOCKER_BUILDKIT=0 docker build -q --build-arg BASE="$base" --target "$target" -t "$tag" "$ctx" 2>&1 >/dev/null |
  { grep -v -e DEPRECATED -e BuildKit -e environment-variable -e '^$' >&2 || true; }
echo "$tag"
