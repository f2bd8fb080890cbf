#!/usr/bin/env bash
# bench/decode_ab.sh: the full GPU tests and the decode rows for two builds in one device call
# (a bundled candidate NAME and NAME_base / tessera-bench-base), interleaved twice for spread.
# VARIANTS="name:ENV=value ..." adds the candidate run under each environment (tests: decode only).
#   usage (GPU machine, repo root, bundle in .bundle): [VARIANTS=...] bench/decode_ab.sh OUT_DIR
set -uo pipefail
out=${1:?usage: decode_ab.sh OUT_DIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
for b in "" _base; do
  timeout 200 .bundle/run gpu_tests$b --gtest_brief=1 > "$out/tests$b.log" 2>&1
  echo "gpu_tests$b exit $?" >> "$out/tests$b.log"
  tail -3 "$out/tests$b.log"
done
for v in ${VARIANTS:-}; do
  env "${v#*:}" timeout 100 .bundle/run gpu_tests --gtest_brief=1 --gtest_filter='*Decode*' > "$out/tests_${v%%:*}.log" 2>&1
  echo "gpu_tests ${v%%:*} exit $?" >> "$out/tests_${v%%:*}.log"
  tail -2 "$out/tests_${v%%:*}.log"
done
.bundle/run tessera-bench --only d2d_copy > "$out/bench.jsonl"
for pass in 1 2; do
  .bundle/run tessera-bench --only decode | sed "s/\"impl\": \"tessera\"/\"impl\": \"new$pass\"/" >> "$out/bench.jsonl"
  .bundle/run tessera-bench-base --only decode | sed "s/\"impl\": \"tessera\"/\"impl\": \"base$pass\"/" >> "$out/bench.jsonl"
  for v in ${VARIANTS:-}; do
    env "${v#*:}" .bundle/run tessera-bench --only decode | sed "s/\"impl\": \"tessera\"/\"impl\": \"${v%%:*}-$pass\"/" >> "$out/bench.jsonl"
  done
done
TESSERA_BENCH_KV_SETS=1 .bundle/run tessera-bench --only decode_b1_ | sed 's/"impl": "tessera"/"impl": "new-l2warm"/' >> "$out/bench.jsonl"
.bundle/run tessera-bench --only d2d_copy | sed 's/"impl": "cudaMemcpy"/"impl": "cudaMemcpy2"/' >> "$out/bench.jsonl"
python3 - "$out/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
copy = next(r["gbps"] for r in rows if r["impl"] == "cudaMemcpy")
print(f"copy {copy:.0f} GB/s, second copy {next(r['gbps'] for r in rows if r['impl'] == 'cudaMemcpy2'):.0f}")
for r in rows:
    if r["case"] != "d2d_copy":
        print(f'{r["impl"]:12s} {r["case"]:18s} {r["median_ms"]*1e3:9.2f} us (p10 {r["p10_ms"]*1e3:.2f} p90 {r["p90_ms"]*1e3:.2f}) {r["gbps"]:8.1f} GB/s {100*r["gbps"]/copy:5.1f}%')
PY
