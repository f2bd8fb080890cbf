#!/usr/bin/env bash
# bench/engine_ab.sh: every row of tessera-engine-bench for two builds in one device call: a
# candidate (tessera-engine-bench) and a base (tessera-engine-bench-base, the same benchmark built
# from an earlier commit), on the three Llama shapes and the real SmolLM2, PAIRS (default 3) runs
# each in the order base, new, new, base, ... so that drift over the run falls on both. Prints each
# row's ratio of the builds' medians over their runs (new / base; for ttft, a time, base / new, so
# > 1 is faster either way). REPS (default 5) sets each run's --reps. A small model's prefill and
# ttft rows move by up to 30% from one process to the next of the same binary (the reps within a
# process agree): they need about 10 pairs before a ratio means anything, or every run on the same CPU
# cores: CPUS (default 2-3) pins each run with taskset where it exists.
#   usage (GPU machine, repo root; bundle from the device recipe in $TESSERA_BUNDLE (default
#   .bundle) holding both binaries; SmolLM2 GGUF at $TESSERA_MODEL_DIR/smollm2-135m-instruct/):
#     bench/engine_ab.sh OUT_DIR
set -uo pipefail
out=${1:?usage: engine_ab.sh OUT_DIR}
mkdir -p "$out"
B=${TESSERA_BUNDLE:-$PWD/.bundle}
smol=${TESSERA_MODEL_DIR:-/tmp/models}/smollm2-135m-instruct
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1

pin=""
command -v taskset > /dev/null && pin="taskset -c ${CPUS:-2-3}"

# run BINARY BUILD_LABEL: every case of every model, each line tagged with the build.
run() {
  local bin=$1 build=$2
  for target in "--shape smollm2-135m" "--shape tinyllama-1.1b" "--shape llama2-7b" "--model $smol"; do
    # shellcheck disable=SC2086
    timeout 300 $pin "$B/run" "$bin" $target --cases decode prefill offline --reps "${REPS:-5}" 2>> "$out/engine_ab.err" |
      sed "s/^{/{\"build\": \"$build\", /" >> "$out/engine_ab.jsonl"
  done
}
for ((pair = 0; pair < ${PAIRS:-3}; ++pair)); do
  for build in base new; do
    [ $((pair % 2)) = 1 ] && build=$([ $build = base ] && echo new || echo base)
    if [ $build = base ]; then run tessera-engine-bench-base base; else run tessera-engine-bench new; fi
  done
done

python3 - "$out/engine_ab.jsonl" <<'PY' | tee "$out/engine_ab_summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
groups = {}
for r in rows:
    key = (r["model"], r["case"], r.get("batch", 1), r.get("prompt_tokens", 0))
    groups.setdefault(key, {}).setdefault(r["build"], []).append(r["median"])
print(f'{"model":32s} {"case":16s} {"batch":>5s} {"base":>12s} {"new":>12s} {"ratio":>7s}')
worst = None
for key, builds in groups.items():
    if "base" not in builds or "new" not in builds:
        print(f"{key}: missing a build: {sorted(builds)}")
        continue
    base, new = statistics.median(builds["base"]), statistics.median(builds["new"])
    ratio = base / new if "ttft" in key[1] else new / base  # > 1: the new build is faster
    worst = ratio if worst is None else min(worst, ratio)
    print(f"{key[0]:32s} {key[1]:16s} {key[2]:5d} {base:12.1f} {new:12.1f} {ratio:7.3f}")
print(f"rows {len(groups)}, slowest ratio {worst:.3f}" if worst is not None else "no rows")
PY
