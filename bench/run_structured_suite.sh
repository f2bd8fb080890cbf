#!/usr/bin/env bash
# bench/run_structured_suite.sh: constrained decoding on the GPU in one device call: the device
# sampler's grammar masks against the host sampler, the structured-output and tool-calling
# integration tests against `tessera serve --backend cuda`, and serve_load with and without a JSON
# schema (1, 8 and 64 clients) for each served model, the two runs of a model back to back, and the
# grammar benchmark on the machine's CPU.
#   usage (GPU machine, repo root; bundle from the device recipe in $TESSERA_BUNDLE (default
#   .bundle), SmolLM2 GGUF at $TESSERA_MODEL_DIR/smollm2-135m-instruct/, Python wheels in .pyw;
#   extra GGUFs to load-test in $TESSERA_EXTRA_MODELS, space-separated; more vocabularies for the
#   grammar benchmark in $TESSERA_GRAMMAR_VOCABS):
#     bench/run_structured_suite.sh OUT_DIR [steps...]
#   steps (default all): tests integration load grammar
set -uo pipefail
out=${1:?usage: run_structured_suite.sh OUT_DIR [steps...]}
shift
steps=${*:-tests integration load grammar}
mkdir -p "$out"
want() { [[ " $steps " == *" $1 "* ]]; }
export TESSERA_MODEL_DIR=${TESSERA_MODEL_DIR:-/tmp/models}
B=${TESSERA_BUNDLE:-$PWD/.bundle}
smol=$TESSERA_MODEL_DIR/smollm2-135m-instruct
mkdir -p /tmp/tbin && printf '#!/bin/sh\nexec %s/run tessera "$@"\n' "$B" > /tmp/tbin/tessera && chmod +x /tmp/tbin/tessera
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
[ -d "${TESSERA_WHEELS:-.pyw}" ] && pip install -q --no-index --find-links "${TESSERA_WHEELS:-.pyw}" --target /tmp/pylib openai grpcio grpcio-tools \
  grpcio-health-checking grpcio-reflection jsonschema gguf > "$out/pip.log" 2>&1
export PYTHONPATH=/tmp/pylib

if want tests; then
  timeout 300 $B/run backend_gpu_tests --gtest_filter='CudaTokenMask.*:CudaRequestOptions.*' > "$out/backend_gpu_tests.log" 2>&1
  echo "backend_gpu_tests exit $?" >> "$out/backend_gpu_tests.log"
  grep -E "^\[ +(OK|FAILED|PASSED) |exit" "$out/backend_gpu_tests.log" | tail -12
fi
if want integration; then
  export TESSERA_TEST_BACKEND=cuda TESSERA_TEST_EMBEDDING=0 TESSERA_BIN=/tmp/tbin/tessera
  timeout 500 python3 -m pytest -q -s -p no:cacheprovider tests/integration/test_structured_outputs.py \
    tests/integration/test_schema_corpus_serving.py tests/integration/test_openai_sdk.py \
    -k "not embed and not models_list" > "$out/integration.log" 2>&1
  grep "schema corpus:" "$out/integration.log"
  echo "integration exit $?" >> "$out/integration.log"
  tail -5 "$out/integration.log"
fi

# serve MODEL PORT: starts tessera serve on MODEL, waits for /ready, prints the served name.
serve() {
  /tmp/tbin/tessera serve --backend cuda --model "$1" --set http.port="$2" --set grpc.enabled=false \
    --set limits.max_running_sequences=128 > "$out/serve_$2.log" 2>&1 &
  echo $! > "/tmp/serve_$2.pid"
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$2/ready" > /dev/null && break; sleep 1; done
}
if want load; then
  # An array of at least 100 integers: no output completes it within 128 tokens, so every request
  # decodes exactly 128 tokens with the schema too.
  echo '{"type": "array", "items": {"type": "integer"}, "minItems": 100}' > /tmp/bench_schema.json
  port=8090
  for model in "$smol" ${TESSERA_EXTRA_MODELS:-}; do
    serve "$model" $port
    name=$(curl -s http://127.0.0.1:$port/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
    for schema in "" /tmp/bench_schema.json; do
      timeout 300 python3 bench/serve_load.py --url http://127.0.0.1:$port --model "$name" --max-tokens 128 \
        --concurrency 1,8,64 --processes 8 ${schema:+--json-schema "$schema"} --out "$out/serve_structured.jsonl" \
        > /dev/null 2>> "$out/serve_load.err"
    done
    curl -s http://127.0.0.1:$port/metrics | grep -E "grammar_(mask|compile)_seconds_(sum|count)" >> "$out/grammar_metrics.txt"
    kill -TERM "$(cat /tmp/serve_$port.pid)"; wait "$(cat /tmp/serve_$port.pid)"
    port=$((port + 1))
  done
  python3 - "$out/serve_structured.jsonl" <<'PY' | tee "$out/serve_structured_summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {(r["model"], r["concurrency"], r.get("response_format")): r for r in rows}
print(f'{"model":40s} {"clients":>7s} {"free tok/s":>11s} {"schema tok/s":>12s} {"ratio":>6s} {"errors":>6s}')
for (model, clients, fmt), r in by.items():
    if fmt is not None:
        continue
    s = by.get((model, clients, "json_schema"))
    if s is None:
        continue
    ratio = s["output_tok_per_s"] / r["output_tok_per_s"]
    print(f'{model:40s} {clients:7d} {r["output_tok_per_s"]:11.1f} {s["output_tok_per_s"]:12.1f} {ratio:6.3f} '
          f'{r["errors"] + s["errors"]:6d}')
PY
fi
if want grammar; then
  python3 tests/grammar/make_schema_corpus.py /tmp/schema_corpus.jsonl > /dev/null
  vocabs=(--tokenizer "$smol/SmolLM2-135M-Instruct.Q4_1.gguf")
  for v in ${TESSERA_GRAMMAR_VOCABS:-}; do vocabs+=(--tokenizer "$v"); done
  # One compile thread (MaskBench's setting), then eight (the server's compiler may use more).
  for threads in 1 8; do
    timeout 400 $B/run tessera-grammar-bench --corpus /tmp/schema_corpus.jsonl "${vocabs[@]}" \
      --compile-threads $threads >> "$out/grammar_bench.jsonl" 2>> "$out/grammar_bench.err"
  done
  echo "grammar bench exit $? on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" >> "$out/grammar_bench.err"
  cat "$out/grammar_bench.jsonl"
fi
