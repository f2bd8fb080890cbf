#!/usr/bin/env bash
# Tensor parallelism on a host with two GPUs, in one device call: the TP tests, the NCCL all-reduce
# latency by size, then the engine benchmark with TP=1 beside TP=2 on the Llama-2-7B shape and the
# Llama-2-70B shape (80 layers, hidden 8192, 64 heads, 8 KV heads) at TP=2 in bf16 and fp8_e4m3
# weights, all with random weights.
#
#   usage: bench/run_tp_suite.sh BUNDLE OUT_DIR      (BUNDLE: a bundle.sh folder with backend_gpu_tests,
#                                                     tessera-allreduce-bench, tessera-engine-bench)
# Env: TP_PARTS (default "tests allreduce 7b 70b"; also "7b_fused"; "onegpu": the single-GPU test
# binaries on GPU 0 alone; "serve70b": `tessera serve` of the 70B shape at TP=2 with fp8_e4m3 weights,
# loaded by bench/serve_load.py at 1, 8 and 64 clients, which needs the bundle's `tessera`, httpx
# wheels in .pyh (or $TESSERA_WHEELS) and Llama 2's vocabulary, .lc/ggml-vocab-llama-spm.gguf from
# llama.cpp's source (or $LLAMA_VOCAB)),
# "integration": the serving integration suite (run_engine_suite.sh's serve step) against `tessera
# serve --backend cuda --tensor-parallel 2`, with SmolLM2 padded to 12 heads and 4 KV heads by
# tests/integration/pad_attention_heads.py (same logits; its 9 heads and 3 KV heads do not split),
# which needs the GGUF at $SMOL_GGUF (unless /tmp/padded holds the padded copy already),
# .lc/llama.cpp.tgz for gguf-py and the client wheels in .pyw),
# "7b_lm_head": the 7B shape at TP=2 with the lm_head replicated instead of split by vocabulary,
# "7b_nccl": the 7B shape at TP=2 with every all-reduce by NCCL (no one-shot kernel),
# REPS (default 3).
set -uo pipefail
bundle=$1
out=$2
parts=${TP_PARTS:-tests allreduce 7b 70b}
reps=${REPS:-3}
# NVLink multicast (NVLS) stays off on the lent machines.
export NCCL_NVLS_ENABLE=0
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > "$out/gpus.txt"
want() { [[ " $parts " == *" $1 "* ]]; }

if want tests; then
  timeout 300 "$bundle/run" backend_gpu_tests --gtest_brief=1 \
    --gtest_filter='TensorParallelGpu.*:GpuEngine.TwoModelsOnOneBackendReplayTheirOwnGraphs' > "$out/tp_tests.txt" 2>&1
  echo "tp tests rc $?" >> "$out/tp_tests.txt"
fi
if want onegpu; then
  for t in backend_gpu_tests gpu_tests; do
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$bundle/run" "$t" --gtest_brief=1 --gtest_filter=-StickyError.* > "$out/onegpu_$t.txt" 2>&1
    echo "$t rc $?" >> "$out/onegpu_$t.txt"
  done
fi
if want allreduce; then
  timeout 120 "$bundle/run" tessera-allreduce-bench --ranks 2 > "$out/allreduce.jsonl" 2> "$out/allreduce.err"
fi
engine() {  # engine NAME ARGS...: one engine-bench run, JSON lines into engine.jsonl, log beside
  local name=$1; shift
  timeout 300 "$bundle/run" tessera-engine-bench --reps "$reps" "$@" >> "$out/engine.jsonl" 2> "$out/engine_$name.err"
  echo "$name rc $?" >> "$out/engine_rc.txt"
}
if want 7b; then
  for tp in 1 2; do
    engine "7b_tp$tp" --shape llama2-7b --cases decode prefill offline --batches 64 --tensor-parallel "$tp"
  done
fi
# The same with the tuner's two decode fusions (SiLU in the gate-up GEMV's epilogue, RoPE in the
# KV write): fewer launches a layer, which do not shrink with more ranks.
if want 7b_fused; then
  for tp in 1 2; do
    engine "7b_fused_tp$tp" --shape llama2-7b --cases decode prefill offline --batches 64 --tensor-parallel "$tp" \
      --fusions gate_up_epilogue rope_kv_write
  done
fi
if want 7b_lm_head; then
  engine 7b_tp2_lm_head_replicated --shape llama2-7b --cases decode offline --batches 64 --tensor-parallel 2 \
    --lm-head replicated
fi
if want 7b_nccl; then
  engine 7b_tp2_nccl --shape llama2-7b --cases decode offline --batches 64 --tensor-parallel 2 --allreduce nccl
fi
if want integration; then
  padded=/tmp/padded/smollm2-135m-instruct
  mkdir -p /tmp/gg "$padded"
  if [ ! -f "$padded/model.gguf" ]; then
    tar xzf .lc/llama.cpp.tgz -C /tmp/gg llama.cpp/gguf-py
    PYTHONPATH=/tmp/gg/llama.cpp/gguf-py python3 tests/integration/pad_attention_heads.py "${SMOL_GGUF:?}" \
      "$padded/model.gguf" --ranks 2 > "$out/pad.log" 2>&1
  fi
  TESSERA_MODEL_DIR=/tmp/padded TESSERA_TEST_TENSOR_PARALLEL=2 TESSERA_BUNDLE="$(cd "$bundle" && pwd)" \
    bench/run_engine_suite.sh "$out/integration_tp2" serve > /dev/null 2>&1
fi
if want 70b; then
  engine 70b_bf16_tp2 --shape llama2-70b --cases decode offline --batches 64 --tensor-parallel 2
  engine 70b_fp8_tp2 --shape llama2-70b --cases decode offline --batches 64 --tensor-parallel 2 --linear-weights fp8_e4m3
fi
if want serve70b; then
  pip install -q --no-index --find-links "${TESSERA_WHEELS:-.pyh}" --target /tmp/pylib httpx > "$out/pip.log" 2>&1
  port=8090
  "$bundle/run" tessera serve --model configs/tune/llama2-70b-shape --random-weights \
    --tokenizer "${LLAMA_VOCAB:-.lc/ggml-vocab-llama-spm.gguf}" --tensor-parallel 2 --cuda-weights fp8_e4m3 \
    --set http.port=$port --set grpc.enabled=false --set limits.max_model_len=2048 > "$out/serve70b.log" 2>&1 &
  server=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/ready" > /dev/null && break
    kill -0 $server 2> /dev/null || break
    sleep 1
  done
  dev="2x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), tensor_parallel 2, fp8_e4m3"
  PYTHONPATH=/tmp/pylib timeout 300 python3 bench/serve_load.py --url "http://127.0.0.1:$port" \
    --model configs/tune/llama2-70b-shape --concurrency 1,8,64 --rounds 2 --max-tokens 128 --device "$dev" \
    --out "$out/serve70b.jsonl" > /dev/null 2> "$out/serve_load.err"
  kill -TERM $server
  wait $server
fi
