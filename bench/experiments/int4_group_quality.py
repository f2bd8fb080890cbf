#!/usr/bin/env python3
"""bench/experiments/int4_group_quality.py: how much perplexity int4 weights lose at each group size, on the CPU.

The GPU's int4_g128 format re-quantizes SmolLM2's linears, which ship only as Q4_1 (4-bit, groups of
32, a scale and a min each), to 4 bits in groups of 128. This script isolates that step: it writes
copies of the GGUF with every layer linear (q, k, v, o, gate, up, down) dequantized and fake-quantized
to asymmetric int4 (scale = (max - min) / 15, zero = min, round to nearest, as the GPU's quantizer
does) in groups of G, optionally with a per-group clip search (the [min, max] range shrunk from each
end in 2.5 % steps, up to 25 %, keeping the least squared error), all tensors stored as F32. Then it
measures each copy's perplexity with `tessera tune` on the CPU backend, against the unquantized F32
copy, on the same held-out text the GPU tune uses (4,096 tokens of exllamav2's wiki.utf8, windows
of 512). One JSON line per variant.

Needs the PyPI package gguf (pip install gguf==0.17.1) and ~0.55 GB of disk per variant.
  python3 bench/experiments/int4_group_quality.py --tessera build-cpu/server/tessera --groups 32 64 128 --clip 128
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tuner"))
from calibrate_int4 import gguf_writer_like  # noqa: E402
MODEL_DIR = Path(os.environ.get("TESSERA_MODEL_DIR", Path.home() / ".cache/tessera/models"))
GGUF = MODEL_DIR / "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
LINEARS = ("attn_q.", "attn_k.", "attn_v.", "attn_output.", "ffn_gate.", "ffn_up.", "ffn_down.")

SPACE = """backend: cpu
context: 1024
weight_format: [gguf]
kv_dtype: [f32]
fusions: {add_rms_norm: [fused], qkv: [fused], gate_up: [fused], rope_kv_write: [separate]}
cuda_graphs: [false]
kernels: {threads: [0], activation_bits: [16]}
measure: {prefill_tokens: [16], decode_batch: [1], decode_context: 16, warmup: 0, repeats: 1}
quality: {tokens: 4096, window: 512}
policy: {fastest_decode_within_ppl_pct: 100}
search: {exhaustive_max: 4}
"""


def int4_qdq(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Quantize-dequantize x to asymmetric int4 on the grid lo + q * (hi - lo) / 15, q in [0, 15]."""
    scale = (hi - lo) / 15.0
    inverse = np.where(scale > 0, 1.0 / np.where(scale > 0, scale, 1.0), 0.0)
    return np.clip(np.rint((x - lo) * inverse), 0, 15) * scale + lo


def int4_range(x: np.ndarray, clip: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each row's [lo, hi] for one group ([n, g]): its min and max, or with clip the shrunk range
    (up to 25 % from each end in 2.5 % steps) with the least squared error."""
    lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
    if not clip:
        return lo, hi
    best_lo, best_hi = lo, hi
    error = ((int4_qdq(x, lo, hi) - x) ** 2).sum(-1, keepdims=True)
    for a in np.linspace(0, 0.25, 11):
        for b in np.linspace(0, 0.25, 11):
            c_lo, c_hi = lo + (hi - lo) * a, hi - (hi - lo) * b
            e = ((int4_qdq(x, c_lo, c_hi) - x) ** 2).sum(-1, keepdims=True)
            better = e < error
            best_lo, best_hi, error = np.where(better, c_lo, best_lo), np.where(better, c_hi, best_hi), np.minimum(e, error)
    return best_lo, best_hi


def fake_int4(x: np.ndarray, clip: bool) -> np.ndarray:
    """Quantize-dequantize rows of one group ([n, g]) to asymmetric int4."""
    return int4_qdq(x, *int4_range(x, clip))


def rtn_int4(w: np.ndarray, group: int, clip: bool = False) -> np.ndarray:
    """Round-to-nearest int4 of a [out, in] weight in groups of `group` along its input dimension."""
    q = np.empty_like(w)
    for start in range(0, w.shape[1], group):  # the last group may be shorter, as on the GPU
        end = min(w.shape[1], start + group)
        q[:, start:end] = fake_int4(w[:, start:end].astype(np.float64), clip)
    return q


def is_linear(name: str) -> bool:
    return any(p in name for p in LINEARS)


def write_gguf(src: Path, dst: Path, transform, extra: dict[str, np.ndarray] | None = None) -> float:
    """Copies src to dst with every tensor dequantized to F32 and passed through transform(name, w),
    which returns the replacement or None to keep w; `extra` tensors (name -> array) are appended, also
    as F32. Returns the replaced tensors' relative L2 error."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf_writer_like(reader, dst)
    error = total = 0.0
    for tensor in reader.tensors:
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        q = transform(tensor.name, w)
        if q is not None:
            q = q.astype(np.float32)
            error += float(((q - w) ** 2).sum())
            total += float((w ** 2).sum())
            w = q
        writer.add_tensor(tensor.name, w, raw_dtype=gguf.GGMLQuantizationType.F32)
    for name, w in (extra or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return (error / total) ** 0.5 if total > 0 else 0.0


def write_variant(src: Path, dst: Path, group: int, clip: bool) -> float:
    """Writes the F32 copy (group 0: unquantized); returns the linears' relative L2 weight error."""
    return write_gguf(src, dst, lambda name, w: rtn_int4(w, group, clip) if group > 0 and is_linear(name) else None)


def perplexity(tessera: str, model: Path, space: Path, out: Path) -> float:
    run = subprocess.run([tessera, "tune", "--model", str(model), "--space", str(space), "--out", str(out),
                          "--no-progress"], capture_output=True, text=True, check=True)
    return float(re.search(r"reference perplexity ([0-9.]+)", run.stdout + run.stderr).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tessera", default=str(REPO / "build-cpu/server/tessera"))
    ap.add_argument("--gguf", default=str(GGUF))
    ap.add_argument("--groups", type=int, nargs="+", default=[32, 64, 128], help="round-to-nearest group sizes")
    ap.add_argument("--clip", type=int, nargs="*", default=[128], help="group sizes also run with the clip search")
    ap.add_argument("--out", default=str(REPO / "bench/experiments/results/int4_group_quality.jsonl"))
    args = ap.parse_args()
    variants = [(0, False)] + [(g, False) for g in args.groups] + [(g, True) for g in args.clip]
    with tempfile.TemporaryDirectory(prefix="tessera-int4-") as tmp:
        space = Path(tmp) / "space.yaml"
        space.write_text(SPACE)
        reference = None
        for group, clip in variants:
            model = Path(tmp) / "model.gguf"
            weight_error = write_variant(Path(args.gguf), model, group, clip)
            ppl = perplexity(args.tessera, model, space, Path(tmp) / f"tune-{group}-{int(clip)}")
            reference = ppl if group == 0 else reference
            line = {"bench": "int4_group_quality", "model": Path(args.gguf).name,
                    "variant": "f32 (reference)" if group == 0 else f"int4 g{group}" + (" + clip search" if clip else ""),
                    "group": group, "clip_search": clip, "weight_rel_l2": round(weight_error, 5),
                    "ppl": round(ppl, 4), "delta_ppl_pct": round(100 * (ppl / reference - 1), 2),
                    "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                             capture_output=True, text=True).stdout.strip()}
            print(json.dumps(line), flush=True)
            with open(args.out, "a") as out:
                out.write(json.dumps(line) + "\n")
            model.unlink()


if __name__ == "__main__":
    main()
