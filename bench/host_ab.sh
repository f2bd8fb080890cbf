#!/usr/bin/env bash
# bench/host_ab.sh: the host side of tessera-engine-bench's batch-1 prefill for two builds, on a
# machine without a GPU. Both run on the CUDA stub (bench/cuda_stub: every CUDA and cuBLASLt call
# returns at once and is counted), so what is left is the host's own work between the calls. Prints:
#   - CUDA calls per prefill step of each build (runs at --reps 10 minus --reps 5: 80 more steps, half
#     of 512 tokens and half of 128), the driver work a step asks for;
#   - the diff of the last step's calls (kernel, grid, block, shared memory, GEMM shapes, copies):
#     empty when both builds launch the same work;
#   - the host time per step without the driver (ttft and prefill lines' medians), three runs each,
#     interleaved.
# Needs g++ and the CUDA headers (/usr/local/cuda/include), not a GPU.
#   usage: bench/host_ab.sh BASE_BENCH NEW_BENCH [ENGINE_BENCH_ARGS...]   (default --shape smollm2-135m)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: host_ab.sh BASE_BENCH NEW_BENCH [ARGS...]" >&2; exit 2; }
declare -A bin=([base]=$1 [new]=$2)
shift 2
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--shape smollm2-135m)
here=$(cd "$(dirname "$0")" && pwd)
cuda_include=${CUDA_INCLUDE:-/usr/local/cuda/include}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# stub LIBRARY SOURCE [LINK_ARGS...]: the library under the real one's name, its symbols under the
# real one's version node, so that the binary's versioned references bind to it.
stub() {
  local lib=$1 src=$2
  shift 2
  echo "$lib { global: *; };" > "$work/$lib.map"
  g++ -O2 -fPIC -shared -std=c++20 -I"$cuda_include" "$here/cuda_stub/$src" -o "$work/$lib" \
    -Wl,-soname,"$lib" -Wl,--version-script="$work/$lib.map" "$@"
}
stub libcudart.so.13 cudart_stub.cpp
stub libcublasLt.so.13 cublaslt_stub.cpp -L"$work" -l:libcudart.so.13

on_stub() { LD_LIBRARY_PATH="$work" "$@"; }

for build in base new; do
  for reps in 5 10; do
    TESSERA_STUB_COUNTS="$work/$build.$reps.counts" on_stub "${bin[$build]}" "${args[@]}" --cases prefill --reps $reps > /dev/null 2>&1
  done
  TESSERA_STUB_TRACE="$work/$build.trace" on_stub "${bin[$build]}" "${args[@]}" --cases prefill --reps 1 > /dev/null 2>&1
  # The last step: from its plan upload's wait on the previous one (prepare_step) to the sample's wait.
  awk '{ line[NR] = $0 } /^event_sync$/ { n = NR }
       END { for (i = n; i <= NR; ++i) { print line[i]; if (line[i] == "stream_sync") break } }' "$work/$build.trace" |
    sed -E 's/_GLOBAL__N__[0-9a-f_]+//g' > "$work/$build.step"
done

echo "CUDA calls per prefill step (base, new):"
python3 - "$work" <<'PY'
import sys
work = sys.argv[1]
def calls(build):
    a, b = ({k: int(v) for k, v in (l.split() for l in open(f"{work}/{build}.{r}.counts"))} for r in (5, 10))
    return {k: (b.get(k, 0) - a.get(k, 0)) / 80 for k in set(a) | set(b)}
base, new = calls("base"), calls("new")
for k in sorted(set(base) | set(new)):
    if base.get(k, 0) or new.get(k, 0):
        print(f"  {k:34s} {base.get(k, 0):8.2f} {new.get(k, 0):8.2f}")
print(f"  {'(all)':34s} {sum(base.values()):8.2f} {sum(new.values()):8.2f}")
PY
echo "the last step's calls, base vs new ($(wc -l < "$work/new.step") in new):"
diff "$work/base.step" "$work/new.step" && echo "  the same"

cat > "$work/times.py" <<'PY'
import json, sys
cells = []
for line in sys.stdin:
    r = json.loads(line)
    ms = r["prompt_tokens"] / r["median"] * 1e3 if r["unit"] == "tok/s" else r["median"]
    cells.append(f"{r['case']} {r['prompt_tokens']}: {ms * 1e3:7.1f}")
print(f"  {sys.argv[1]} run {sys.argv[2]}: " + "   ".join(cells))
PY
echo "host time per step, CUDA stubbed (us):"
for run in 1 2 3; do
  for build in base new; do
    on_stub "${bin[$build]}" "${args[@]}" --cases prefill --reps 10 2> /dev/null | python3 "$work/times.py" $build $run
  done
done
