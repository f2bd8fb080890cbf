#!/usr/bin/env bash
# tests/gpu/sdpa/run_sdpa_tests.sh: runs test_attention_vs_sdpa.py on the GPU machine against the shim
# in a bundle made by shared/device/bundle.sh, and writes its JUnit report (each case's max-abs error
# as a property) and its log (each case's errors, then the worst per op and dtype) to OUT_DIR.
#
#   here:  ninja -C build tessera_attention_shim
#          ../shared/device/bundle.sh .bundle build/tests/gpu/sdpa/libtessera_attention_shim.so
#   there: (device run, carry .bundle) tests/gpu/sdpa/run_sdpa_tests.sh .bundle "$OUT" [PYTEST_ARGS...]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUNDLE_DIR OUT_DIR [PYTEST_ARGS...]" >&2; exit 2; }
bundle=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
shim="$bundle/bin/libtessera_attention_shim.so"
[ -f "$shim" ] || { echo "$shim is missing: bundle build/tests/gpu/sdpa/libtessera_attention_shim.so" >&2; exit 2; }

# As the bundle's run script does: the toolkit (the shim's libcudart) and PyTorch's NVIDIA wheels. The
# bundle's lib/ is left off: it holds this machine's libstdc++, older than the GPU machine's, and
# would shadow the system's for torch too; the shim needs nothing from it.
nv=""
for lib in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do
  if [ -d "$lib" ]; then nv+="$lib:"; fi
done
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${nv}${LD_LIBRARY_PATH:-}"
export TESSERA_ATTENTION_SHIM="$shim" PYTHONDONTWRITEBYTECODE=1
if ldd "$shim" | grep "not found"; then
  echo "the shim's libraries above are not found on this machine" >&2
  exit 2
fi
# The test skips itself without torch or a GPU, which on this machine would hide a broken setup.
python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" ||
  { echo "python3 has no torch with a CUDA GPU here" >&2; exit 2; }

cd "$(dirname "$0")"
python3 -m pytest test_attention_vs_sdpa.py -v -s -rs -p no:cacheprovider --junitxml="$out/sdpa-junit.xml" "$@" 2>&1 |
  tee "$out/sdpa-log.txt"
