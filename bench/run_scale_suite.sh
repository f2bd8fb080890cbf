#!/usr/bin/env bash
# bench/run_scale_suite.sh: serving at scale on the GPU machine, Tessera beside llama.cpp's
# llama-server on the same Llama-2-7B-shape F16 GGUF (random weights, Llama 2's 32k SentencePiece
# vocabulary), with bench/serve_scale.py as the client for both.
#   usage (GPU machine, repo root; bundle from the device recipe in $TESSERA_BUNDLE (default .bundle),
#   Python wheels in .pyw, llama.cpp's source as .lc/llama.cpp.tgz and its vocab-only
#   .lc/ggml-vocab-llama-spm.gguf, both from llama-cpp-python 0.3.36's sdist):
#     bench/run_scale_suite.sh OUT_DIR [steps...]
#   steps (default all): setup sweep tessera llama reliability
#     setup        the 7B GGUF in /tmp/models, llama.cpp's build started in the background
#     sweep        tessera at each $SWEEP_BATCH_TOKENS step size: the GPU default's measurement
#     tessera      tessera serve with no flags but the model and port: closed (prompts of about 100,
#                  1,000, 1,370 and 3,900 tokens: 3,900 + 128 fits the shape's 4,096), open and streams
#     llama        llama-server, the same three modes
#     reliability  KV exhaustion, the stall and fail-step timings, and a soak with RSS / GPU memory
set -uo pipefail
out=${1:?usage: run_scale_suite.sh OUT_DIR [steps...]}
shift
steps=${*:-setup sweep tessera llama reliability}
mkdir -p "$out"
want() { [[ " $steps " == *" $1 "* ]]; }
B=${TESSERA_BUNDLE:-$PWD/.bundle}
model=/tmp/models/llama2-7b-shape/llama2-7b-shape-f16.gguf
lc=/tmp/lc
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
mkdir -p /tmp/tbin && printf '#!/bin/sh\nexec %s/run tessera "$@"\n' "$B" > /tmp/tbin/tessera && chmod +x /tmp/tbin/tessera
export PYTHONPATH=/tmp/pylib NCCL_NVLS_ENABLE=0
scale() { timeout "${SCALE_TIMEOUT:-900}" python3 bench/serve_scale.py --device "$dev" "$@"; }

if want setup; then
  pip install -q --no-index --find-links .pyw --target /tmp/pylib httpx > "$out/pip.log" 2>&1
  pip install -q --no-index --no-deps --find-links .pyw --target /tmp/pylib gguf pyyaml tqdm >> "$out/pip.log" 2>&1
  if [ ! -x $lc/build/bin/llama-server ] && [ -f .lc/llama.cpp.tgz ]; then
    mkdir -p $lc && tar xzf .lc/llama.cpp.tgz -C $lc
    setsid bash -c "cmake -S $lc/llama.cpp -B $lc/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release > $lc/cmake.log 2>&1 &&
      nice -n 19 ninja -C $lc/build -j10 llama-server > $lc/build.log 2>&1; echo \$? > $lc/build.rc" < /dev/null > /dev/null 2>&1 &
  fi
  if [ ! -f $model ]; then
    mkdir -p "$(dirname $model)"
    python3 bench/make_random_gguf.py --config configs/tune/llama2-7b-shape/config.json \
      --tokenizer-from "${TESSERA_VOCAB_GGUF:-.lc/ggml-vocab-llama-spm.gguf}" --out $model 2>&1 | tail -1
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt"
fi

# tessera_up PORT [--set ...]: serves the 7B GGUF, waits for /ready; its pid in /tmp/serve_PORT.pid.
tessera_up() {
  local port=$1
  shift
  /tmp/tbin/tessera serve --model $model --set http.port="$port" --set grpc.enabled=false "$@" \
    > "$out/tessera_$port.log" 2>&1 &
  echo $! > /tmp/serve_$port.pid
  for _ in $(seq 240); do
    curl -sf "http://127.0.0.1:$port/ready" > /dev/null && return 0
    kill -0 "$(cat /tmp/serve_$port.pid)" 2> /dev/null || break
    sleep 0.5
  done
  echo "tessera on $port did not come up"; tail -5 "$out/tessera_$port.log"; return 1
}
down() { kill -TERM "$(cat /tmp/serve_$1.pid)" 2> /dev/null; wait "$(cat /tmp/serve_$1.pid)" 2> /dev/null; }
served() { curl -s "http://127.0.0.1:$1/v1/models" | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])"; }

if want sweep; then
  # Each entry LABEL=KEY=VALUE[,KEY=VALUE...]: closed levels at 64 clients and one open-loop rate.
  port=8200
  for entry in ${SWEEP_CONFIGS:-mbt2048=limits.max_batch_tokens=2048 mbt4096=limits.max_batch_tokens=4096 \
                mbt8192=limits.max_batch_tokens=8192}; do
    label=${entry%%=*}
    sets=()
    IFS=, read -ra kvs <<< "${entry#*=}"
    for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
    tessera_up $port "${sets[@]}" || continue
    grep -E "warmed up" "$out/tessera_$port.log"
    name=$(served $port)
    scale --url http://127.0.0.1:$port --model "$name" --label "tessera $label" --mode closed \
      --prompt-tokens ${SWEEP_PROMPTS:-100,1000,1370,3900} --concurrency 64 --max-tokens 128 --rounds 2 \
      --processes 4 --level-timeout 120 --out "$out/sweep.jsonl" > /dev/null 2>> "$out/sweep.err"
    [ -n "${SWEEP_RATE:-}" ] && scale --url http://127.0.0.1:$port --model "$name" --label "tessera $label" \
      --mode open --rates "$SWEEP_RATE" --duration 20 --drain 20 --seed 1 --out "$out/sweep.jsonl" > /dev/null 2>> "$out/sweep.err"
    down $port
    port=$((port + 1))
  done
fi

# The three modes against one server at $1, labelled $2; closed-level timeout $3.
three_modes() {
  local url=$1 label=$2 cap=$3 name
  name=$(served "${url##*:}")
  scale --url "$url" --model "$name" --label "$label" --mode closed --prompt-tokens ${PROMPTS:-100,1000,1370,3900} \
    --concurrency 1,8,64 --max-tokens 128 --rounds ${ROUNDS:-2} --processes 4 --level-timeout "$cap" \
    --out "$out/closed.jsonl" > /dev/null 2>> "$out/scale.err"
  scale --url "$url" --model "$name" --label "$label" --mode open --rates ${RATES:-2,4,8,16,24,32} \
    --duration ${OPEN_SECONDS:-20} --drain ${DRAIN:-20} --seed 1 --out "$out/open.jsonl" > /dev/null 2>> "$out/scale.err"
  scale --url "$url" --model "$name" --label "$label" --mode streams --streams 256 --prompt-tokens 200 \
    --max-tokens 128 --processes 4 --level-timeout "$cap" --out "$out/streams.jsonl" > /dev/null 2>> "$out/scale.err"
}

if want tessera; then
  tessera_up 8300 && {
    grep -E "kv cache:|warmed up" "$out/tessera_8300.log"
    three_modes http://127.0.0.1:8300 tessera 300
    curl -s http://127.0.0.1:8300/metrics | grep -E "^tessera:(num_preemptions|request_success)" > "$out/tessera_metrics.txt"
    down 8300
  }
fi

if want llama; then
  for _ in $(seq 400); do [ -f $lc/build.rc ] && break; sleep 1; done
  if [ "$(cat $lc/build.rc 2> /dev/null)" != 0 ]; then
    echo "llama-server did not build"; tail -20 $lc/build.log
  else
    # 64 slots sharing one KV pool of the tokens Tessera's default gives this model (--kv-unified), so
    # that no slot's context caps a 4,000-token prompt.
    $lc/build/bin/llama-server -m $model -ngl 99 -fa on -np 64 -c ${LLAMA_CTX:-120000} --kv-unified \
      --host 127.0.0.1 --port 8400 > "$out/llama_server.log" 2>&1 &
    echo $! > /tmp/serve_8400.pid
    for _ in $(seq 240); do curl -sf http://127.0.0.1:8400/health > /dev/null && break; sleep 0.5; done
    three_modes http://127.0.0.1:8400 llama-server ${LLAMA_LEVEL_CAP:-150}
    down 8400
  fi
fi

if want reliability; then
  # A pool of 6,144 tokens for 64 clients of ~1,100 tokens each: preemption and resumption; every
  # request must complete or fail explicitly (lost 0).
  tessera_up 8500 --set limits.kv_cache_tokens=6144 && {
    scale --url http://127.0.0.1:8500 --model "$(served 8500)" --label "tessera kv=6144" --mode closed \
      --prompt-tokens 1000 --concurrency 64 --max-tokens 256 --rounds 1 --processes 4 --level-timeout 300 \
      --out "$out/kv_exhaustion.jsonl" > /dev/null 2>> "$out/scale.err"
    curl -s http://127.0.0.1:8500/metrics | grep -E "^tessera:(num_preemptions|request_success|num_requests)" \
      > "$out/kv_exhaustion_metrics.txt"
    down 8500
  }
  # The soak: mixed completions, chats and mid-stream cancels, RSS and GPU memory sampled.
  [ "${SOAK_MINUTES:-8}" -gt 0 ] && tessera_up 8600 && {
    timeout $((${SOAK_MINUTES:-8} * 60 + 120)) python3 bench/soak.py --url http://127.0.0.1:8600 \
      --pid "$(cat /tmp/serve_8600.pid)" --model "$(served 8600)" --embedding-model '' --minutes ${SOAK_MINUTES:-8} \
      --interval 15 --clients 32 --gpu --out "$out/soak.jsonl" > "$out/soak_samples.jsonl" 2>> "$out/soak.err"
    down 8600
  }
fi
