#!/usr/bin/env bash
# bench/cpu_llamacpp.sh: runs bench/cpu_llamacpp.py (Tessera beside llama.cpp on the SmolLM2-135M GGUF,
# CPU). Builds llama-cpp-python from source into a private venv per CPU model on first use (several
# minutes on 2 cores). Not part of CI. Extra arguments go to the Python script.
#   env: TESSERA_BENCH_VENV (the venv; default: one per CPU model under ~/.cache/tessera),
#        CMAKE_BUILD_PARALLEL_LEVEL (compile jobs; default: every core)
#
# The build names this CPU's instruction sets explicitly instead of GGML_NATIVE: a -march=native
# build (or a wheel one left in pip's cache on another CPU model) can use instructions this CPU lacks,
# and a native build on a CPU with AMX enables it, whose first `tilezero` dies with SIGILL where the
# kernel hands out AMX state only to a process that asks for it (which ggml does not). So: no wheel cache, AMX off, one venv
# per (CPU model, flags).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
llama_cpp_version=0.3.36

cpu_name=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-)
has() { [[ " $cpu_flags " == *" $1 "* ]] && echo ON || echo OFF; }
cpu_key=$(printf '%s' "$cpu_name" | tr -c 'A-Za-z0-9' '-' | tr -s '-' | sed 's/-$//')-$(printf '%s' "$cpu_flags" | sha256sum | cut -c1-8)

ggml_flags=(
  -DGGML_NATIVE=OFF
  -DGGML_SSE42="$(has sse4_2)" -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_BMI2="$(has bmi2)"
  -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" -DGGML_AVX_VNNI="$(has avx_vnni)"
  -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)"
  -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)"
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
)

venv="${TESSERA_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/venv-bench-$cpu_key}"  # outside the tree
if [[ ! -x "$venv/bin/python" ]]; then
  mkdir -p "$(dirname "$venv")" && python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  echo "building llama-cpp-python $llama_cpp_version for '$cpu_name' into $venv: ${ggml_flags[*]}" >&2
  CMAKE_ARGS="${ggml_flags[*]}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$venv/bin/pip" install --no-cache-dir --no-binary llama-cpp-python "llama-cpp-python==$llama_cpp_version" numpy
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exec "$venv/bin/python" "$repo/bench/cpu_llamacpp.py" "$@"
