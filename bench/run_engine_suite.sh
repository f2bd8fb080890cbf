#!/usr/bin/env bash
# bench/run_engine_suite.sh: the GPU engine check in one device call: kernel tests, backend and
# engine tests against the CPU backend, compute-sanitizer on a short generate, the end-to-end
# benchmarks with the HF transformers peers in the same run, and the serving integration suite and
# serve_load against `tessera serve --backend cuda`.
#   usage (GPU machine, repo root; bundle from the device recipe in $TESSERA_BUNDLE (default .bundle), SmolLM2 GGUF at
#   $TESSERA_MODEL_DIR/smollm2-135m-instruct/, Python wheels for the clients in .pyw):
#     TESSERA_COMMIT=<sha> bench/run_engine_suite.sh OUT_DIR [steps...]
#   steps (default all): tests sanitizer bench peers serve load docs
set -uo pipefail
out=${1:?usage: run_engine_suite.sh OUT_DIR [steps...]}
shift
steps=${*:-tests sanitizer bench peers serve load docs}
mkdir -p "$out"
want() { [[ " $steps " == *" $1 "* ]]; }
export TESSERA_MODEL_DIR=${TESSERA_MODEL_DIR:-/tmp/models}
B=${TESSERA_BUNDLE:-$PWD/.bundle}  # the bundle (bundle.sh output); may sit outside the repo
smol=$TESSERA_MODEL_DIR/smollm2-135m-instruct
# The bundled binary needs the bundle's libraries: a wrapper named tessera for the tests and load.
mkdir -p /tmp/tbin && printf '#!/bin/sh\nexec %s/run tessera "$@"\n' "$B" > /tmp/tbin/tessera && chmod +x /tmp/tbin/tessera
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1

if want tests; then
  if [ -x "$B/bin/gpu_tests" ]; then
    timeout 300 $B/run gpu_tests --gtest_brief=1 > "$out/gpu_tests.log" 2>&1
    echo "gpu_tests exit $?" >> "$out/gpu_tests.log"
    tail -3 "$out/gpu_tests.log"
  fi
  timeout 400 $B/run backend_gpu_tests --gtest_filter=-StickyError.* > "$out/backend_gpu_tests.log" 2>&1
  echo "backend_gpu_tests exit $?" >> "$out/backend_gpu_tests.log"
  # A sticky error poisons the CUDA context of its process: that test runs on its own.
  timeout 120 $B/run backend_gpu_tests --gtest_filter=StickyError.* >> "$out/backend_gpu_tests.log" 2>&1
  echo "backend_gpu_sticky_error exit $?" >> "$out/backend_gpu_tests.log"
  grep -E "^\[cuda|PASSED|FAILED|exit" "$out/backend_gpu_tests.log" | tail -40
fi
if want sanitizer; then
  timeout 300 compute-sanitizer --tool memcheck --leak-check full $B/run tessera generate --backend cuda \
    --model "$smol" --prompt "The capital of France is" --max-tokens 16 --temperature 0 > "$out/memcheck.log" 2>&1
  echo "memcheck exit $?" >> "$out/memcheck.log"
  tail -4 "$out/memcheck.log"
fi
if want bench; then
  for shape in smollm2-135m tinyllama-1.1b llama2-7b; do
    cases="decode offline"
    [ "$shape" = llama2-7b ] && cases="decode prefill offline"
    timeout 300 $B/run tessera-engine-bench --shape "$shape" --cases $cases >> "$out/engine.jsonl" 2>> "$out/engine.err"
  done
  timeout 200 $B/run tessera-engine-bench --model "$smol" --cases decode offline >> "$out/engine.jsonl" 2>> "$out/engine.err"
  cat "$out/engine.jsonl"
fi
if want peers; then
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/hf_peers.py --budget-s 230 >> "$out/peers.jsonl" 2> "$out/peers.err"
  cat "$out/peers.jsonl"
fi
if want serve; then
  pip install -q --no-index --find-links "${TESSERA_WHEELS:-.pyw}" --target /tmp/pylib openai grpcio grpcio-tools grpcio-health-checking grpcio-reflection > "$out/pip.log" 2>&1
  # The embedding tests run too when all-MiniLM-L6-v2 came up. The device has no Prometheus server
  # or promtool, which two /metrics tests start.
  embedding=0
  [ -f "$TESSERA_MODEL_DIR/all-minilm-l6-v2/model.safetensors" ] && embedding=1
  skip="not promtool and not prometheus_scrapes"
  [ $embedding = 0 ] && skip="$skip and not embed and not models_list"
  export PYTHONPATH=/tmp/pylib TESSERA_TEST_BACKEND=cuda TESSERA_TEST_EMBEDDING=$embedding
  export TESSERA_BIN=/tmp/tbin/tessera
  timeout 400 python3 -m pytest -q -p no:cacheprovider tests/integration/test_openai_sdk.py tests/integration/test_grpc.py \
    tests/integration/test_concurrency.py tests/integration/test_prometheus.py tests/integration/test_bad_input.py \
    tests/integration/test_openai_surface.py tests/integration/test_kv_reuse.py tests/integration/test_connections.py \
    -k "$skip" > "$out/integration.log" 2>&1
  echo "integration exit $?" >> "$out/integration.log"
  tail -5 "$out/integration.log"
fi
if want load; then
  export PYTHONPATH=/tmp/pylib
  /tmp/tbin/tessera serve --backend cuda --model "$smol" --set http.port=8080 --set grpc.enabled=false \
    --set limits.max_running_sequences=128 > "$out/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf http://127.0.0.1:8080/ready > /dev/null && break; sleep 1; done
  model=$(curl -s http://127.0.0.1:8080/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
  timeout 300 python3 bench/serve_load.py --url http://127.0.0.1:8080 --model "$model" --max-tokens 128 \
    --concurrency 1,8,64 --processes 8 --out "$out/serve_gpu.jsonl" > /dev/null 2> "$out/serve_load.err"
  kill -TERM $pid; wait $pid; echo "serve exit $?" >> "$out/serve.log"
  cat "$out/serve_gpu.jsonl"
fi
if want docs; then
  # TTFT of eight 512-token documents cold, reordered (prefix cache only), and reused (bench/document_reuse.py).
  /tmp/tbin/tessera serve --backend cuda --model "$smol" --set http.port=8081 --set grpc.enabled=false \
    --set limits.max_model_len=8192 > "$out/serve_docs.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf http://127.0.0.1:8081/ready > /dev/null && break; sleep 1; done
  timeout 300 python3 bench/document_reuse.py --url http://127.0.0.1:8081 --reps 10 --backend cuda \
    --out "$out/document_reuse_cuda.jsonl" > /dev/null 2> "$out/document_reuse.err"
  kill -TERM $pid; wait $pid; echo "serve exit $?" >> "$out/serve_docs.log"
  cat "$out/document_reuse_cuda.jsonl"
fi
