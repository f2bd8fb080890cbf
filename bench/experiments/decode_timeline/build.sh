#!/usr/bin/env bash
# bench/experiments/decode_timeline/build.sh: builds the timeline program against this tree's decode
# kernel, in three variants (as is, ring filled unpaced, next launch released at the start), into
# OUT_DIR as timeline_{base,unpaced,early}. Needs nvcc (sm_90a), not a GPU; each binary is standalone.
#   usage: bench/experiments/decode_timeline/build.sh OUT_DIR;  then on the GPU: OUT_DIR/timeline_base 4096
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
python3 "$here/instrument.py" "$repo" "$out/decode_traced.cuh"
cp "$here/trace.cuh" "$out/"
for variant in base unpaced early; do
  defs=()
  [ $variant = unpaced ] && defs=(-DDIAG_UNPACED)
  [ $variant = early ] && defs=(-DDIAG_EARLY_RELEASE)
  nvcc -I"$repo" -I"$out" -O2 -std=c++20 --generate-code=arch=compute_90a,code=sm_90a "${defs[@]}" \
    "$here/timeline.cu" -o "$out/timeline_$variant" &
done
wait
