#!/usr/bin/env bash
# bench/run_smollm2_tune.sh: SmolLM2-135M's int4 calibration, GPU tune and served profiles on an
# H100, in back-to-back device calls (each under the 10-minute limit; later steps read what earlier
# ones left in WORK and beside the model):
#   calibrate  tuner/calibrate_int4.py writes the int4_g128 sidecar beside the GGUF (Shakespeare from
#              $CHECK_TEXTS, if set, is scored as text unlike any calibration text);
#   tune       the tune of configs/tune/gpu-smollm2.yaml (int4_g128 candidates load the sidecar);
#   serve      the bf16 baseline tune, the same tune re-chosen with an 8 % policy (all candidates
#              resumed, so it picks among the same measurements), the chosen, bf16 and int4 profiles
#              served one after the other (bench/profile_decode.py), and backend_gpu_tests.
# usage (GPU machine, repo root, bundle in .bundle, model dir holding smollm2-135m-instruct and
# eval-text-wiki and calibration-text, the gguf package importable):
#   TESSERA_MODEL_DIR=/tmp/models bench/run_smollm2_tune.sh calibrate|tune|serve WORK OUT
set -uo pipefail
step=${1:?usage: run_smollm2_tune.sh calibrate|tune|serve WORK OUT}
work=${2:?WORK}
out=${3:?OUT}
mkdir -p "$work" "$out"
tessera="$work/tessera"
printf '#!/bin/bash\nexec %s/.bundle/run tessera "$@"\n' "$PWD" > "$tessera"
chmod +x "$tessera"
model=smollm2-135m-instruct

case "$step" in
  calibrate)
    nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt" 2>&1
    checks=()
    for f in ${CHECK_TEXTS:-}; do checks+=(--check-text "$f"); done
    python3 tuner/calibrate_int4.py --model "$TESSERA_MODEL_DIR/$model" --tessera "$tessera" "${checks[@]}" \
      --result "$out/calibrate.jsonl" > /dev/null 2> "$out/calibrate.log"
    echo "calibrate exit $?"
    grep perplexity "$out/calibrate.log"
    ;;
  tune)
    "$tessera" tune --model "$model" --space configs/tune/gpu-smollm2.yaml --out "$work/tune" --no-progress \
      > "$out/tune.log" 2>&1
    echo "tune exit $?"
    tail -6 "$out/tune.log"
    ;;
  serve)
    "$tessera" tune --model "$model" --space configs/tune/gpu-smollm2-bf16.yaml --out "$work/tune-bf16" \
      --no-progress > "$out/tune-bf16.log" 2>&1
    echo "bf16 tune exit $?"
    cp -r "$work/tune" "$work/tune-int4"
    sed 's/fastest_decode_within_ppl_pct: 1$/fastest_decode_within_ppl_pct: 8/' configs/tune/gpu-smollm2.yaml \
      > "$work/gpu-smollm2-8pct.yaml"
    "$tessera" tune --model "$model" --space "$work/gpu-smollm2-8pct.yaml" --out "$work/tune-int4" --no-progress \
      > "$out/tune-int4.log" 2>&1
    echo "8 % re-choice exit $?"
    grep -A1 '^chosen' "$out/tune-int4.log"
    python3 bench/profile_decode.py --tessera "$tessera" --model "$model" --reps 3 \
      --profile "bf16=$work/tune-bf16/profile.yaml" --profile "chosen=$work/tune/profile.yaml" \
      --profile "within8pct=$work/tune-int4/profile.yaml" > "$out/profile_decode.jsonl" 2> "$out/profile_decode.err"
    echo "profile_decode exit $?"
    cat "$out/profile_decode.jsonl"
    timeout 300 .bundle/run backend_gpu_tests --gtest_brief=1 --gtest_filter=-StickyError.* \
      > "$out/backend_gpu_tests.log" 2>&1
    echo "backend_gpu_tests exit $?"
    tail -3 "$out/backend_gpu_tests.log"
    tar czf "$out/tune.tgz" -C "$work" tune tune-bf16 tune-int4
    ;;
  *) echo "unknown step $step (calibrate, tune or serve)" >&2; exit 2 ;;
esac
