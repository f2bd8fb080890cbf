#!/usr/bin/env python3
"""bench/experiments/int4_rotation_awq_quality.py: do rotation and AWQ together bring SmolLM2's int4_g128 within 8 %?

int4_rotation_quality.py (norms folded, Hadamard residual rotation + per-head V/O rotation, then GPTQ)
measured +9.04 % / +9.75 % (seeds 0 / 1); int4_awq_quality.py (AWQ scales, then GPTQ) +9.19 %. The two
rewrites compose: the rotation spreads the residual stream's outliers over all channels, AWQ then
rescales whatever per-channel imbalance the calibration activations still show. This script chains
them, importing both scripts' code:
  1. int4_rotation_quality.rotate(): norm gains folded into the linears (all gains 1 after), the
     residual stream rotated by a seeded signed Hadamard Q, v / attn_output rotated per kv head ("+vo");
  2. int4_awq_quality.awq_model() on the rotated model: per layer group an alpha on AWQ's grid, chosen
     by the output error of RTN g128 of the scaled weights; 1/s folds into the (unit) attn/ffn norm
     gains, o_proj's into v's rows, down_proj's into up's rows, so the F32 model is unchanged;
  3. int4_gptq_quality.gptq_model() (act-order, static groups, clip search, sequential calibration on
     the same 128 x 256 wiki tokens) on the rotated + scaled F32 weights.
Per seed: the rotated + scaled F32 copy (must match the reference within 0.1 %, else the script stops),
the GPTQ result, and its RTN g128 re-quantization (the GPU loader's view). With --alpha-by gptq the
alpha of each group is instead chosen by the output error after GPTQ of the scaled weights (same H;
awq_error_vs_unscaled is then RTN's error at the chosen alpha over GPTQ's at alpha 0, since awq_model
still RTN-quantizes for its sequential forward), ~20x slower per alpha, hence --alphas.

Every copy is an F32 GGUF in a temporary directory scored with `tessera tune` on the CPU backend (the
same space and 4,096 held-out tokens as the other scripts). One JSON line per variant, appended to
bench/experiments/results/int4_rotation_awq_quality.jsonl; weight_rel_l2 is against the rotated + scaled
unquantized linears. About 9 minutes a seed on 2 cores.
  python3 bench/experiments/int4_rotation_awq_quality.py --tessera build-cpu/server/tessera --seeds 0 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import int4_awq_quality as awq  # noqa: E402
from int4_group_quality import SPACE, is_linear, perplexity, rtn_int4, write_gguf  # noqa: E402
from int4_gptq_quality import GROUP, Model, add_common_args, calibration, git_commit, gptq, gptq_model, record  # noqa: E402
from int4_rotation_quality import rotate  # noqa: E402

CHECK_PCT = 0.1
ROTATION = "hadamard+vo"


def gptq_error_search(w: np.ndarray, H: np.ndarray, x_mean: np.ndarray, w_mean: np.ndarray | None = None):
    """awq.search_scale's contract, but alpha is chosen by the output error of GPTQ (act-order, static
    groups, clip) of the scaled weights, whose inputs' second moment is H / (s s^T)."""
    def quantize(ws, s):
        return gptq(ws, 2.0 * H / np.outer(s, s), act_order=True, clip=True)

    ones = np.ones(w.shape[1])
    best, base_err = None, awq.output_error(w, quantize(w, ones), H)
    for alpha in awq.ALPHAS:
        s = awq.awq_scales(x_mean, alpha, w_mean)
        err = awq.output_error(w, quantize(w * s[None, :], s) / s[None, :], H)
        if best is None or err < best[2]:
            best = (s, float(alpha), err)
    return best[0], best[1], base_err, best[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, "int4_rotation_awq_quality")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1], help="rotation seeds")
    ap.add_argument("--alpha-by", choices=["rtn", "gptq"], default="rtn",
                    help="the quantizer whose output error picks each group's AWQ alpha")
    ap.add_argument("--alphas", type=float, nargs="*", default=None,
                    help="the alpha grid (default AWQ's 0, 0.05, .., 1; GPTQ's error costs ~0.1 s a group per alpha)")
    args = ap.parse_args()
    src = Path(args.gguf)
    commit = git_commit()
    calib, description = calibration(args)
    model = Model(src)
    original = model.w
    if args.alphas is not None:
        awq.ALPHAS = np.array(args.alphas)  # search_scale and gptq_error_search read it at call time
    if args.alpha_by == "gptq":
        awq.search_scale = gptq_error_search  # awq_model looks it up at call time

    with tempfile.TemporaryDirectory(prefix="tessera-rotawq-") as tmp:
        space = Path(tmp) / "space.yaml"
        space.write_text(SPACE)
        reference = None

        def score(variant: str, seed: int | None, weights: dict | None, quantized: dict | None, t: float,
                  fields: dict) -> float:
            """Scores src with `weights` (every tensor, output.weight included) and the `quantized`
            linears in place; appends the JSON line."""
            nonlocal reference
            path = Path(tmp) / "model.gguf"
            quantized = quantized or {}
            num = sum(float(((q.astype(np.float64) - weights[n]) ** 2).sum()) for n, q in quantized.items())
            den = sum(float((weights[n].astype(np.float64) ** 2).sum()) for n in quantized)
            if weights is None:
                write_gguf(src, path, lambda n, w: None)
            else:
                write_gguf(src, path, lambda n, w: quantized.get(n, weights[n]),
                           None if "output.weight" in original else {"output.weight": weights["output.weight"]})
            ppl = perplexity(args.tessera, path, space, Path(tmp) / "tune")
            path.unlink()
            reference = reference or ppl
            line = {"bench": "int4_rotation_awq_quality", "model": src.name, "variant": variant,
                    "rotation": ROTATION if seed is not None else None, "seed": seed, "group": GROUP,
                    "alpha_by": args.alpha_by, "alpha_grid": [float(a) for a in awq.ALPHAS], **fields, "weight_rel_l2": round((num / den) ** 0.5, 5) if den else 0.0,
                    "ppl": round(ppl, 4), "delta_ppl_pct": round(100 * (ppl / reference - 1), 2)}
            record(args.out, line, t, commit)
            return ppl

        score("f32 (reference)", None, None, None, time.time(), {"quantizer": None})
        for seed in args.seeds:
            t = time.time()
            rotated = rotate(model, ROTATION, seed)
            model.w, model.lm_head = rotated, rotated["output.weight"]
            try:
                scaled, _, alphas, gains = awq.awq_model(model, calib, clip=False)
                weights = {**rotated, **scaled}
                del rotated, scaled
                name = f"norms folded, rotated {ROTATION}, AWQ-scaled (alpha by {args.alpha_by} error)"
                fields = {"calibration": description, "alphas": alphas, "awq_error_vs_unscaled": gains}
                ppl = score(f"f32, {name}", seed, weights, None, t, {"quantizer": None, **fields})
                if abs(ppl / reference - 1) * 100 > CHECK_PCT:
                    sys.exit(f"seed {seed}: F32 perplexity {ppl} is not the reference's {reference}; the rewrite is wrong")
                t = time.time()
                model.w = dict(weights)
                q = gptq_model(model, calib, act_order=True, clip=True)
            finally:
                model.w, model.lm_head = original, original.get("output.weight", original["token_embd.weight"])
            fields["quantizer"] = "rotation + awq scales + gptq act-order static groups + clip"
            label = f"int4 g128 GPTQ act-order static groups + clip search, {name}"
            score(label, seed, weights, q, t, fields)
            t = time.time()
            score(label + ", RTN-requantized (the GPU loader's view)", seed, weights,
                  {n: rtn_int4(q[n], GROUP) for n in q if is_linear(n)}, t, fields)
            del weights, q


if __name__ == "__main__":
    main()
