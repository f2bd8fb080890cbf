#!/usr/bin/env bash
# bench/run_spec_suite.sh: speculative decoding on the GPU machine, on against off in one call:
# `tessera serve --backend cuda` of the same binary and model, one that does not speculate and one
# per speculating label (below), each with a tenth of the GPU's free memory for KV (each sees the
# memory of the ones before it as used); then bench/spec_bench.py at 1, 8 and 64 clients for
# each beside the server that does not speculate; then, where the bundle has tessera-engine-bench,
# the served model's and the 7B shape's step times with an acceptance profile replayed.
# Labels: ngram (the defaults), ngram_exact (no unambiguous short suffixes:
# prompt_lookup_unambiguous_min 2), ngram_min1 (any suffix down to one token), ngram_k7 (up to 7
# drafts), suffix, suffix_request (no cache of recent outputs: drafts from the request alone), and
# draft_self (the model drafting for itself, the only packaged one). Every level asks the same
# question again, so the suffix cache holds its answer after the first: `suffix` is the
# repeated-task case SuffixDecoding targets, `suffix_request` the single request.
#   usage (GPU machine, repo root; bundle from the device recipe in $TESSERA_BUNDLE (default .bundle),
#   the model in $SPEC_MODEL (default the SmolLM2 GGUF in /tmp/models), Python wheels in $WHEELS
#   (default .pyw)):
#     bench/run_spec_suite.sh OUT_DIR
#   SPEC_LEVELS (CLIENTS:ROUNDS:REPEATS triples; default "1:32:2 8:24:4 64:48:4") shapes the levels:
#   each client sends ROUNDS requests, and each server runs the level REPEATS times. SPEC_ON
#   (PORT:LABEL pairs; default "8702:ngram 8706:ngram_min1 8707:ngram_k7 8703:suffix
#   8704:suffix_request 8705:draft_self") picks the speculating servers, SPEC_BENCH_ARGS (say
#   --ignore-eos) goes to bench/spec_bench.py.
set -uo pipefail
out=${1:?usage: run_spec_suite.sh OUT_DIR}
mkdir -p "$out"
B=${TESSERA_BUNDLE:-$PWD/.bundle}
model=${SPEC_MODEL:-/tmp/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
pip install -q --no-index --find-links "${WHEELS:-.pyw}" --target /tmp/pylib httpx > "$out/pip.log" 2>&1
export PYTHONPATH=/tmp/pylib

# serve PORT LABEL METHOD [SET...]: a server speculating with METHOD; its pid in /tmp/spec_PORT.pid.
serve() {
  local port=$1 label=$2 method=$3
  shift 3
  $B/run tessera serve --backend cuda --model "$model" --set http.port="$port" --set grpc.enabled=false \
    --set speculative.method="$method" --set limits.kv_cache_memory_fraction=0.1 "$@" > "$out/serve_$label.log" 2>&1 &
  echo $! > "/tmp/spec_$port.pid"
}
# What each speculating server's label runs: its method and settings.
declare -A settings=(
  [ngram]="ngram"
  [ngram_exact]="ngram --set speculative.prompt_lookup_unambiguous_min=2"
  [ngram_min1]="ngram --set speculative.prompt_lookup_min=1"
  [ngram_k7]="ngram --set speculative.num_speculative_tokens=7"
  [suffix]="suffix"
  [suffix_request]="suffix --set speculative.suffix_decoding_max_cached_requests=0"
  [draft_self]="draft_model --set speculative.draft_model=$model"
)
spec_on=${SPEC_ON:-8702:ngram 8706:ngram_min1 8707:ngram_k7 8703:suffix 8704:suffix_request 8705:draft_self}
# One at a time: a speculating server times its decode steps at warm-up, which another server
# warming up on the same GPU would distort.
ready() {
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$1/ready" > /dev/null && break; sleep 0.5; done
}
ports=8701
serve 8701 none none
ready 8701
for on in $spec_on; do
  # shellcheck disable=SC2086  # the settings split into words on purpose
  serve "${on%%:*}" "${on##*:}" ${settings[${on##*:}]}
  ready "${on%%:*}"
  ports="$ports ${on%%:*}"
done
name=$(curl -s http://127.0.0.1:8701/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
for on in $spec_on; do
  for lvl in ${SPEC_LEVELS:-1:32:2 8:24:4 64:48:4}; do
    IFS=: read -r clients rounds repeats <<< "$lvl"
    # shellcheck disable=SC2086  # the extra arguments split into words on purpose
    timeout 600 python3 bench/spec_bench.py --off http://127.0.0.1:8701 --on "http://127.0.0.1:${on%%:*}" \
      --model "$name" --label "${on##*:}" --clients "$clients" --rounds "$rounds" --repeats "$repeats" \
      --max-tokens 128 ${SPEC_BENCH_ARGS:-} --device "$dev" --out "$out/spec_bench.jsonl" 2>> "$out/spec_bench.err" | grep summary
  done
done
for port in $ports; do kill -TERM "$(cat /tmp/spec_$port.pid)"; done
wait
# The 7B shape's verify and decode step times, with the acceptance the SmolLM2 levels measured for
# n-gram and request-only suffix drafts replayed on them (random weights keep no draft).
# Then the served model's own decode and verify steps in the engine alone, without the server's
# scheduling, drafting and HTTP: beside spec_bench's speedups, this says how much of a verify
# step's cost is the step itself.
if [ -x "$B/bin/tessera-engine-bench" ]; then
  timeout 300 "$B/run" tessera-engine-bench --model "$model" --cases speculative --acceptance 0.6 \
    >> "$out/spec_served_model.jsonl" 2>> "$out/spec_7b.err"
  for a in ${SPEC_7B_ACCEPTANCE:-0.6 0.45}; do
    timeout 300 "$B/run" tessera-engine-bench --shape llama2-7b --cases speculative --acceptance "$a" \
      >> "$out/spec_7b.jsonl" 2>> "$out/spec_7b.err"
  done
fi
