#!/usr/bin/env bash
# bench/engine_ab.sh: every row of tessera-engine-bench for two builds in one device call: a
# candidate (tessera-engine-bench) and a base (tessera-engine-bench-base, the same benchmark built
# from an earlier commit), on the three Llama shapes and the real SmolLM2, PAIRS (default 3) runs
# each in the order base, new, new, base, ... so that drift over the run falls on both. Prints each
# row's ratio of the builds' medians over their runs (new / base; for ttft, a time, base / new, so
# > 1 is faster either way). REPS (default 5) sets each run's --reps, CASES (default "decode prefill
# offline") its --cases, SHAPES (default "smollm2-135m tinyllama-1.1b llama2-7b") the random shapes and
# REAL (default 1; 0: leave it out) the real SmolLM2. CPUS (default 2-3) pins each run to those CPU
# cores with taskset where it exists. Rows that carry host_ms (the time until the forward was issued)
# also get the ratio of the builds' host_ms, which tells host time from GPU time. NEW_ARGS goes to
# the candidate alone: against a base from before the CUDA backend served its extra fusions by default
# (default_graph_options), "--fusions none" runs the graph that base runs.
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
  local bin=$1 build=$2 extra=${3:-}
  local targets=()
  for shape in ${SHAPES:-smollm2-135m tinyllama-1.1b llama2-7b}; do targets+=("--shape $shape"); done
  [ "${REAL:-1}" = 1 ] && targets+=("--model $smol")
  for target in "${targets[@]}"; do
    # shellcheck disable=SC2086
    timeout 300 $pin "$B/run" "$bin" $target --cases ${CASES:-decode prefill offline} --reps "${REPS:-5}" $extra 2>> "$out/engine_ab.err" |
      sed "s/^{/{\"build\": \"$build\", /" >> "$out/engine_ab.jsonl"
  done
}
for ((pair = 0; pair < ${PAIRS:-3}; ++pair)); do
  for build in base new; do
    [ $((pair % 2)) = 1 ] && build=$([ $build = base ] && echo new || echo base)
    if [ $build = base ]; then run tessera-engine-bench-base base; else run tessera-engine-bench new "${NEW_ARGS:-}"; fi
  done
done

python3 - "$out/engine_ab.jsonl" <<'PY' | tee "$out/engine_ab_summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
groups, hosts = {}, {}
for r in rows:
    key = (r["model"], r["case"], r.get("batch", 1), r.get("prompt_tokens", 0))
    groups.setdefault(key, {}).setdefault(r["build"], []).append(r["median"])
    if "host_ms" in r:
        hosts.setdefault(key, {}).setdefault(r["build"], []).append(r["host_ms"])


def modes(builds):
    """A small model's prefill lands in one of two speeds per process, whichever the build (measured
    on the H100: 210-230k or 270-310k tok/s for SmolLM2's shape, reps within a process agreeing).
    Runs split at the widest gap between sorted run medians when it exceeds 12%: each part is a mode,
    compared build against build on its own."""
    values = sorted(v for vs in builds.values() for v in vs)
    gaps = [(values[i + 1] / values[i], i) for i in range(len(values) - 1)]
    if not gaps or max(gaps)[0] < 1.12:
        return [("all", builds)]
    cut = values[max(gaps)[1]]
    low = {b: [v for v in vs if v <= cut] for b, vs in builds.items()}
    high = {b: [v for v in vs if v > cut] for b, vs in builds.items()}
    return [("low", low), ("high", high)]


print(f'{"model":34s} {"case":8s} {"batch":>5s} {"mode":>5s} {"runs":>5s} {"base":>12s} {"new":>12s} {"ratio":>7s}')
worst = None
for key, builds in groups.items():
    if "base" not in builds or "new" not in builds:
        print(f"{key}: missing a build: {sorted(builds)}")
        continue
    for mode, part in modes(builds):
        if not part["base"] or not part["new"]:
            print(f"{key[0]:34s} {key[1]:8s} {key[2]:5d} {mode:>5s} only one build in this mode: {part}")
            continue
        base, new = statistics.median(part["base"]), statistics.median(part["new"])
        ratio = base / new if "ttft" in key[1] else new / base  # > 1: the new build is faster
        worst = ratio if worst is None else min(worst, ratio)
        runs = f'{len(part["base"])}+{len(part["new"])}'
        print(f"{key[0]:34s} {key[1]:8s} {key[2]:5d} {mode:>5s} {runs:>5s} {base:12.1f} {new:12.1f} {ratio:7.3f}")
print(f"rows {len(groups)}, slowest ratio {worst:.3f}" if worst is not None else "no rows")
for key, builds in hosts.items():
    if "base" in builds and "new" in builds:
        base, new = statistics.median(builds["base"]), statistics.median(builds["new"])
        print(f"{key[0]:34s} {key[1]:8s} host_ms base {base:.3f} new {new:.3f} base/new {base / new:.3f}")
PY
