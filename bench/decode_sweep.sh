#!/usr/bin/env bash
# bench/decode_sweep.sh: decode-only iteration in one device call: decode tests, the copy ceiling,
# the decode rows (KV rotated past L2 where one set fits), the batch-1 rows L2-warm (one KV set, the
# method before 2026-11-22 09:00), and a sweep of the split length (TESSERA_DECODE_CHUNK).
# Rows on a created non-blocking stream (TESSERA_BENCH_STREAM=1) come out as impl tessera-ownstream.
#   usage (GPU machine, repo root, bundle in .bundle): [TESTS='*'] bench/decode_sweep.sh OUT_DIR [chunks...]
set -uo pipefail
out=${1:?usage: decode_sweep.sh OUT_DIR [chunks...]}
shift
mkdir -p "$out"
timeout 240 .bundle/run gpu_tests --gtest_brief=1 --gtest_filter="${TESTS:-*Decode*}" > "$out/tests.log" 2>&1
echo "gpu_tests exit $?" >> "$out/tests.log"
tail -3 "$out/tests.log"
.bundle/run tessera-bench --only d2d_copy > "$out/decode.jsonl"
.bundle/run tessera-bench --only decode >> "$out/decode.jsonl"
TESSERA_BENCH_STREAM=1 .bundle/run tessera-bench --only decode | sed 's/"impl": "tessera"/"impl": "tessera-ownstream"/' >> "$out/decode.jsonl"
TESSERA_BENCH_KV_SETS=1 .bundle/run tessera-bench --only decode_b1 | sed 's/"impl": "tessera"/"impl": "tessera-l2warm"/' >> "$out/decode.jsonl"
for c in "$@"; do
  TESSERA_DECODE_CHUNK=$c .bundle/run tessera-bench --only decode --samples 20 | sed "s/\"impl\": \"tessera\"/\"impl\": \"chunk$c\"/" >> "$out/sweep.jsonl"
done
python3 - "$out/decode.jsonl" "$out/sweep.jsonl" <<'PY'
import json, sys, os
rows = [json.loads(l) for f in sys.argv[1:] if os.path.exists(f) for l in open(f) if l.startswith("{")]
copy = next(r["gbps"] for r in rows if r["case"] == "d2d_copy")
print(f"copy {copy:.0f} GB/s")
for r in rows:
    if r["case"] != "d2d_copy":
        print(f'{r["impl"]:16s} {r["case"]:18s} {r["median_ms"]*1e3:9.2f} us {r["gbps"]:8.1f} GB/s {100*r["gbps"]/copy:5.1f}%')
PY
