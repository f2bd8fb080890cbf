#!/usr/bin/env bash
# bench/run_gpu_suite.sh: the whole GPU check in one device call: tests, tessera-bench, the PyTorch
# peers, the comparison table, and Nsight Compute profiles of the kernels with open goals.
#   usage (on the GPU machine, repo root, bundle from shared/device/bundle.sh in .bundle):
#     TESSERA_COMMIT=<sha> bench/run_gpu_suite.sh OUT_DIR
set -uo pipefail
out=${1:?usage: run_gpu_suite.sh OUT_DIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
if [ -x .bundle/bin/gpu_tests ]; then
  timeout 300 .bundle/run gpu_tests --gtest_brief=1 > "$out/tests.log" 2>&1
  echo "gpu_tests exit $?" >> "$out/tests.log"
fi
# The attention kernels against torch SDPA, where the bundle has the shim (tests/gpu/sdpa).
if [ -f .bundle/bin/libtessera_attention_shim.so ]; then
  timeout 300 tests/gpu/sdpa/run_sdpa_tests.sh .bundle "$out/sdpa" -q > /dev/null 2>&1
  echo "sdpa tests exit $?" >> "$out/tests.log"
fi
timeout 200 .bundle/run tessera-bench > "$out/bench.jsonl" 2> "$out/bench.err"
PYTHONUNBUFFERED=1 timeout 300 python3 bench/attention_peers.py >> "$out/bench.jsonl" 2> "$out/peers.err"
python3 bench/summarize.py "$out/bench.jsonl" > "$out/summary.md"

# Profiles (clocks left as they are): one launch each, after the benchmark's warm-up launches.
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ]; then
  mkdir -p "$out/ncu"
  profile() {  # name kernel-regex bench-filter
    timeout 120 "$ncu_bin" --clock-control none --target-processes all -k "regex:$2" --launch-skip 5 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats .bundle/run tessera-bench --only "$3" > "$out/ncu/$1.txt" 2>&1
  }
  profile prefill_causal_hd128 prefill_hopper_kernel causal_hd128_b4_s4096
  profile prefill_doc8 prefill_hopper_kernel doc8_causal
  profile prefill_hd64 prefill_hopper_kernel seed_causal_hd64_b4_h32_s4096_fp16
  profile decode_b1_ctx4k decode_kernel decode_b1_ctx4k
  profile decode_b1_ctx16k decode_kernel decode_b1_ctx16k
  profile decode_b16_ctx4k decode_kernel decode_b16_ctx4k
  profile add_rmsnorm_t1 rmsnorm_vec_kernel add_rmsnorm_t1
  tar -C "$out" -cf "$out/ncu.tar" ncu && rm -rf "$out/ncu"
else
  echo "ncu not found" > "$out/ncu_missing.txt"
fi
tail -4 "$out/tests.log"
cat "$out/summary.md"
