#!/usr/bin/env bash
# bench/run_embed_suite.sh: the GPU embedding check on the device: the BERT tests of
# backend_gpu_tests (tiny-bert hidden states in bf16 and fp16, all-MiniLM-L6-v2 on 200 texts against the
# CPU backend, packed rounds against one by one), tessera-embed-bench (BERT-base shape and MiniLM, fp16
# and bf16), the peers in the same run (HF transformers sdpa fp16, sentence-transformers), and
# /v1/embeddings under 1 and 64 clients against `tessera serve --backend cuda` with MiniLM; then the
# table (bench/embed_summary.py) in OUT_DIR/summary.md.
#   usage (GPU machine, repo root; bundle (bundle.sh output holding tessera, backend_gpu_tests and
#   tessera-embed-bench) in $TESSERA_BUNDLE (default .bundle); all-MiniLM-L6-v2 at
#   $TESSERA_MODEL_DIR/all-minilm-l6-v2 (default /tmp/models); the sentence-transformers wheel in
#   $TESSERA_WHEELS (default .pyw), installed only when the machine's python3 cannot import it):
#     TESSERA_COMMIT=<sha> bench/run_embed_suite.sh OUT_DIR [steps...]
#   steps (default all): tests bench peers load summary. Each step appends to its files, so steps can
#   run in separate calls into the same OUT_DIR while the machine stays warm (all steps take about
#   8 minutes; a device command gets 10).
#   The bundle: the executables tessera, backend_gpu_tests and tessera-embed-bench with the shared
#   libraries the GPU machine lacks, stripped (strip --strip-debug) and tar+gzipped (about 36 MB).
set -uo pipefail
out=${1:?usage: run_embed_suite.sh OUT_DIR [steps...]}
shift
steps=${*:-tests bench peers load summary}
mkdir -p "$out"
want() { [[ " $steps " == *" $1 "* ]]; }
export TESSERA_MODEL_DIR=${TESSERA_MODEL_DIR:-/tmp/models}
B=${TESSERA_BUNDLE:-$PWD/.bundle}  # the bundle (bundle.sh output); may sit outside the repo
W=${TESSERA_WHEELS:-$PWD/.pyw}
minilm=$TESSERA_MODEL_DIR/all-minilm-l6-v2
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
[ -f "$minilm/model.safetensors" ] || echo "run_embed_suite: no MiniLM at $minilm: its tests skip, its cases fail" >&2

if want tests; then
  # The BERT tests only (the decoder and engine tests belong to run_engine_suite.sh).
  timeout 400 "$B/run" backend_gpu_tests --gtest_filter='*TinyBert*:*RealMiniLm*:EncoderParity.*' \
    > "$out/embed_tests.log" 2>&1
  echo "backend_gpu_tests (bert) exit $?" >> "$out/embed_tests.log"
  grep -E "^\[cuda-bert|PASSED|FAILED|SKIPPED|exit" "$out/embed_tests.log" | tail -40
fi
if want bench; then
  for dtype in fp16 bf16; do
    timeout 240 "$B/run" tessera-embed-bench --shape bert-base --dtype "$dtype" >> "$out/embed.jsonl" 2>> "$out/embed.err"
    timeout 240 "$B/run" tessera-embed-bench --model "$minilm" --dtype "$dtype" >> "$out/embed.jsonl" 2>> "$out/embed.err"
  done
  # The same cases packed under the server's default limits.max_batch_tokens (2048): what a round costs there.
  timeout 120 "$B/run" tessera-embed-bench --shape bert-base --dtype fp16 --cases fixed mixed --max-batch-tokens 2048 \
    >> "$out/embed.jsonl" 2>> "$out/embed.err"
  cat "$out/embed.jsonl"
fi
if want peers; then
  if ! python3 -c "import sentence_transformers" > /dev/null 2>&1; then
    # --no-deps: its needs (transformers, huggingface-hub, scipy, scikit-learn, tqdm) come with the machine's image.
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pyst "$W"/sentence_transformers-*.whl \
      > "$out/pip_st.log" 2>&1 && export PYTHONPATH=/tmp/pyst${PYTHONPATH:+:$PYTHONPATH}
  fi
  # Offline: the machine reaches nothing, and the models load from their folders.
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 timeout 420 python3 bench/embed_peers.py --budget-s 240 --model-dir "$minilm" \
    >> "$out/peers.jsonl" 2> "$out/peers.err"
  cat "$out/peers.jsonl"
fi
if want load; then
  "$B/run" tessera serve --backend cuda --model "$minilm" --set dtype=fp16 --set http.port=8080 \
    --set grpc.enabled=false > "$out/serve_embed.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf http://127.0.0.1:8080/ready > /dev/null && break; sleep 1; done
  model=$(curl -s http://127.0.0.1:8080/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
  timeout 200 python3 bench/serve_load.py --url http://127.0.0.1:8080 --endpoint embeddings --model "$model" \
    --concurrency 1,64 --rounds 32 --processes 8 --device "$gpu" --out "$out/serve_embed.jsonl" > /dev/null 2> "$out/serve_load.err"
  timeout 100 python3 bench/serve_load.py --url http://127.0.0.1:8080 --endpoint embeddings --model "$model" \
    --concurrency 64 --rounds 8 --inputs-per-request 16 --processes 8 --device "$gpu" --out "$out/serve_embed.jsonl" \
    > /dev/null 2>> "$out/serve_load.err"
  kill -TERM $pid; wait $pid; echo "serve exit $?" >> "$out/serve_embed.log"
  cat "$out/serve_embed.jsonl"
fi
if want summary; then
  python3 bench/embed_summary.py "$out/embed.jsonl" "$out/peers.jsonl" "$out/serve_embed.jsonl" > "$out/summary.md"
  cat "$out/summary.md"
fi
