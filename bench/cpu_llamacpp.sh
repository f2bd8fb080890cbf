#!/usr/bin/env bash
# bench/cpu_llamacpp.sh: runs bench/cpu_llamacpp.py (Tessera beside llama.cpp on the SmolLM2-135M GGUF,
# CPU). Installs llama-cpp-python, built from source for this CPU, into a private venv on first use
# (several minutes on 2 cores). Not part of CI. Extra arguments go to the Python script.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${TESSERA_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/venv-bench}"  # outside the tree
if [[ ! -x "$venv/bin/python" ]]; then
  mkdir -p "$(dirname "$venv")" && python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  # GGML_NATIVE: build for this CPU (AVX2/AVX-512 as available), as a local llama.cpp build would be.
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
    "$venv/bin/pip" install --no-binary llama-cpp-python llama-cpp-python numpy
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exec "$venv/bin/python" "$repo/bench/cpu_llamacpp.py" "$@"
