#!/usr/bin/env bash
# Prepares the `docker build` context for deploy/docker/Dockerfile from an existing build, so that no
# compiler runs inside docker:
#   usage: deploy/docker/stage.sh OUT_DIR [TESSERA_BIN] [MODEL_DIR]
#     TESSERA_BIN default build/server/tessera; MODEL_DIR default ${TESSERA_MODEL_DIR:-~/.cache/tessera/models}
# Prints the Dockerfile target that fits the binary: cuda when it links the CUDA runtime, else cpu.
# Shared libraries that no Debian package owns (libcudart, libcublasLt from the CUDA toolkit) are copied
# into OUT_DIR/lib; the Debian packages owning the others go into OUT_DIR/runtime-packages.txt, with
# those of runtime-packages.txt here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: stage.sh OUT_DIR [TESSERA_BIN] [MODEL_DIR]}
bin=${2:-$repo/build/server/tessera}
models=${3:-${TESSERA_MODEL_DIR:-$HOME/.cache/tessera/models}}
[ -x "$bin" ] || { echo "stage: no binary at $bin (scripts/setup builds it)" >&2; exit 1; }
rm -rf "$out"; mkdir -p "$out/bin" "$out/lib" "$out/models"
# A copy: the build may relink the binary under us. Debug info stripped (it is half the file).
cp "$bin" "$out/bin/tessera"
strip --strip-debug "$out/bin/tessera" 2>/dev/null || true
cp "$here/../server.yaml" "$here/Dockerfile" "$out/"
# The module the binary opens with dlopen for tokenizer.model files (models/tokenizer/
# sentencepiece_module.h), from the build's lib/; the image's ld.so.conf names /opt/tessera/lib.
module=$(dirname "$bin")/../lib/libtessera_sentencepiece.so
if [ -f "$module" ]; then
  cp "$module" "$out/lib/"
  strip --strip-debug "$out/lib/libtessera_sentencepiece.so" 2>/dev/null || true
  echo "stage: lib/libtessera_sentencepiece.so from $module" >&2
fi
for m in smollm2-135m-instruct all-minilm-l6-v2; do
  [ -d "$models/$m" ] || { echo "stage: model $m not in $models (scripts/fetch-models installs it)" >&2; exit 1; }
  cp -r "$models/$m" "$out/models/"
done
# The image's Debian packages: runtime-packages.txt (what ldd cannot see) plus the owner of every
# library ldd resolves, so that a new dependency of the binary needs no edit here.
target=cpu
pkgs=$(grep -v '^#' "$here/runtime-packages.txt" | sed '/^$/d')
while read -r lib path; do
  [ -n "$path" ] && [ -f "$path" ] || continue
  real=$(readlink -f "$path")
  owner=$(dpkg -S "$path" 2>/dev/null || dpkg -S "$real" 2>/dev/null || true)
  if [ -n "$owner" ]; then
    pkgs+=$'\n'"${owner%%:*}"
  else
    cp -L "$path" "$out/lib/$lib"
    echo "stage: $lib is not from a Debian package; copied from $path" >&2
    case "$lib" in libcuda*|libcublas*) target=cuda ;; esac
  fi
done < <(ldd "$out/bin/tessera" | awk '$2 == "=>" {print $1, $3}')
{ echo "# runtime-packages.txt plus the owners of the libraries ldd shows (stage.sh)"; sort -u <<<"$pkgs"; } \
  > "$out/runtime-packages.txt"
if ldd "$out/bin/tessera" | grep -q "not found"; then
  echo "stage: the binary has unresolved libraries here:" >&2; ldd "$out/bin/tessera" | grep "not found" >&2; exit 1
fi
echo "$target"
