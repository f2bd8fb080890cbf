#!/usr/bin/env python3
"""bench/experiments/int4_awq_quality.py: does AWQ-style per-input-channel scaling bring SmolLM2's int4_g128 within 8 %?

int4_group_quality.py measured +56 % perplexity for round-to-nearest (RTN) int4 in groups of 128,
int4_gptq_quality.py +13 % for the best GPTQ, int4_rotation_quality.py +9 % for Hadamard + GPTQ. This
script measures activation-aware weight scaling (AWQ, Lin et al. 2023) on the same format, alone and
followed by GPTQ (--scaling duo: AutoAWQ's variant, s = mean|X|^alpha / mean|w^|^(1 - alpha), w^ the
weights over their (row, group) max |w|). Like the rotation it is an offline rewrite of the F32 weights that needs no kernel
change: the GPU loader RTN-quantizes whatever weights it is given.

For each group of linears that read one input X (row-vector convention, a GGUF linear W is [out, in]
and computes X W^T) a per-input-channel scale s is chosen, W's input columns are multiplied by s and
1/s is folded into whatever produces X, so the F32 model is unchanged:
  q/k/v     X = attn_norm(x):      1/s into the attn_norm gain;
  o         X = attention output:  1/s into v's output rows; the channel (query head j, dim d) reads
                                   kv head j // (heads / kv_heads), so s is tied across the query heads
                                   that share a kv head (their mean |X| averaged) to stay foldable;
  gate/up   X = ffn_norm(x):       1/s into the ffn_norm gain;
  down      X = silu(gate) * up:   1/s into up's output rows.
AWQ's recipe: s = mean|X|^alpha per channel, floored at 1e-4 and divided by sqrt(max(s) min(s)),
alpha on a grid 0, 0.05, .., 1 (0 is plain RTN), chosen per group of linears by the output error of the
RTN-g128-quantized scaled weights on the calibration inputs, sum ||X W^T - X (Q(W diag s) / s)^T||^2,
computed from H = X^T X. Row scaling commutes with the int4 groups (they run along the input
dimension, each with its own scale and zero), so folding 1/s into v's and up's rows after they were
quantized keeps them exactly on their int4 grid. "+ clip" adds AWQ's clip search afterwards: per
output row and 128-group, the scaled weights clamped to +-max|w| * (1 - k/20), k = 0..9, then
quantized asymmetrically from the clamped range, keeping the k with the least output error of that
group's partial product (w_g - q_g) H_g (w_g - q_g)^T.

Calibration is sequential, on the same wiki text as int4_gptq_quality.py (128 x 256 tokens past its
first 100,000 characters of prose, disjoint from the evaluation text): each group's inputs come from
the forward with every earlier group, this layer's included, already scaled and quantized.

"gptq" variants take the scaled F32 weights of the AWQ RTN pass (its scales, its changed norm gains)
into int4_gptq_quality.py's GPTQ (act-order, static groups, + its clip search, sequential calibration
on the same tokens).

Every copy is an F32 GGUF scored with `tessera tune` on the CPU backend (the same space and 4,096
held-out tokens, windows of 512, as the other three scripts): the F32 reference, the scaled but
unquantized F32 model (must match the reference within 0.1 %, else the script stops), then each
quantized variant as it was written and re-quantized by RTN g128 (the GPU loader's view; for the RTN
variants it is the same grid up to float rounding, which the line's requant_rel_l2 shows). One JSON
line per variant, appended to bench/experiments/results/int4_awq_quality.jsonl, with the alpha chosen for each
layer's four groups (qkv, o, gate_up, down); weight_rel_l2 is against the scaled unquantized linears.

Needs the PyPI package gguf (pip install gguf==0.17.1), a CPU build of tessera, ~0.55 GB of disk per
variant and ~4 GB of memory. About 13 minutes on 2 cores for the default variants.
  python3 bench/experiments/int4_awq_quality.py --tessera build-cpu/server/tessera --variants rtn rtn-clip gptq-clip
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from int4_group_quality import SPACE, int4_qdq, perplexity, rtn_int4, write_gguf  # noqa: E402
from int4_gptq_quality import GROUP, Model, add_common_args, calibration, git_commit, gptq_model, log, record  # noqa: E402

CHECK_PCT = 0.1  # the scaled F32 copy must score within this of the reference
ALPHAS = np.round(np.arange(21) * 0.05, 2)
CLIP_GRID, CLIP_STEPS = 20, 10  # AWQ's auto_clip: max shrink 0.5 in steps of 1/20
STAGES = ("qkv", "o", "gate_up", "down")


# ---------------------------------------------------------------------------------------------------
# Statistics of the calibration inputs


def second_moment(chunks: list[np.ndarray]) -> np.ndarray:
    """H = X^T X / n over all calibration tokens (float32 GEMM per batch, summed in float64)."""
    H, n = 0.0, 0
    for c in chunks:
        flat = c.reshape(-1, c.shape[-1])
        H = H + (flat.T @ flat).astype(np.float64)
        n += len(flat)
    return H / n


def mean_abs(chunks: list[np.ndarray]) -> np.ndarray:
    total = sum(np.abs(c).reshape(-1, c.shape[-1]).sum(0, dtype=np.float64) for c in chunks)
    return total / sum(c.size // c.shape[-1] for c in chunks)


def output_error(w: np.ndarray, q: np.ndarray, H: np.ndarray) -> float:
    """Mean over tokens of ||x (w - q)^T||^2, from H = X^T X / n."""
    e = (q - w).astype(np.float64)
    return float(((e @ H) * e).sum())


# ---------------------------------------------------------------------------------------------------
# AWQ


def awq_clip(w: np.ndarray, H: np.ndarray, group: int = GROUP) -> np.ndarray:
    """AWQ's clip search: fake-quantized w [out, in] whose each (row, group) range is the clamp to
    +-max|w| (1 - k / 20), k = 0..9, with the least error of the group's partial output under H."""
    w = w.astype(np.float64)
    out = np.empty_like(w)
    for start in range(0, w.shape[1], group):
        end = min(w.shape[1], start + group)
        wg, Hg = w[:, start:end], H[start:end, start:end]
        top = np.abs(wg).max(1, keepdims=True)
        best, best_err = None, None
        for k in range(CLIP_STEPS):
            m = top * (1 - k / CLIP_GRID)
            c = np.clip(wg, -m, m)
            q = int4_qdq(c, c.min(1, keepdims=True), c.max(1, keepdims=True))
            d = q - wg
            err = ((d @ Hg) * d).sum(1)
            if best is None:
                best, best_err = q, err
            else:
                better = err < best_err
                best, best_err = np.where(better[:, None], q, best), np.minimum(err, best_err)
        out[:, start:end] = best
    return out


def awq_scales(x_mean: np.ndarray, alpha: float, w_mean: np.ndarray | None = None) -> np.ndarray:
    """AWQ's s = mean|x|^alpha (or AutoAWQ's duo scaling, / (w_mean^(1 - alpha) + 1e-4)), floored at
    1e-4, normalized by sqrt(max(s) min(s))."""
    s = np.maximum(x_mean, 0.0) ** alpha
    if w_mean is not None:
        s = s / (w_mean ** (1 - alpha) + 1e-4)
    s = np.maximum(s, 1e-4)
    return s / np.sqrt(s.max() * s.min())


def weight_mean(w: np.ndarray, group: int = GROUP) -> np.ndarray:
    """AutoAWQ's per-input-channel weight magnitude: |w| over its (row, group) max, averaged over rows."""
    r = np.empty_like(w)
    for start in range(0, w.shape[1], group):
        g = np.abs(w[:, start:start + group])
        r[:, start:start + group] = g / (g.max(1, keepdims=True) + 1e-6)
    return r.mean(0)


def search_scale(w: np.ndarray, H: np.ndarray, x_mean: np.ndarray,
                 w_mean: np.ndarray | None = None) -> tuple[np.ndarray, float, float, float]:
    """AWQ's grid search of alpha for the input channels of w [out, in] (several linears' rows stacked)
    by the output error under H of RTN g128 of the scaled weights. Returns s, alpha, the error at
    alpha 0 (plain RTN) and at the chosen alpha."""
    best, rtn_err = None, output_error(w, rtn_int4(w, GROUP), H)
    for alpha in ALPHAS:
        s = awq_scales(x_mean, alpha, w_mean)
        err = output_error(w, rtn_int4(w * s[None, :], GROUP) / s[None, :], H)
        if best is None or err < best[2]:
            best = (s, float(alpha), err)
    return best[0], best[1], rtn_err, best[2]


def tie_heads(x_mean: np.ndarray, kv_heads: int, group: int) -> np.ndarray:
    """The attention output's channels (query head j, dim d) as [kv_heads, group, head_dim]: the mean
    over the query heads that read one kv head, so that s can fold into that kv head's v rows."""
    tied = x_mean.reshape(kv_heads, group, -1).mean(1, keepdims=True)
    return np.broadcast_to(tied, (kv_heads, group, tied.shape[-1])).reshape(-1)


def awq_model(model: Model, calib: np.ndarray, clip: bool, duo: bool = False, batch: int = 16):
    """Sequential AWQ over all layers. Returns (scaled, quantized, alphas, errors): every tensor the
    rewrite changes, scaled but unquantized (float32: linears, norm gains); the 7 linears of each layer
    scaled and fake-quantized (RTN g128, or AWQ's clip search); per stage the alpha chosen in each
    layer and the relative output error (chosen / plain RTN). model.w is restored."""
    original = dict(model.w)
    scaled, quant = {}, {}
    alphas = {k: [] for k in STAGES}
    gains = {k: [] for k in STAGES}
    group_q = model.heads // model.kv_heads

    def name(i, n):
        return f"blk.{i}.{n}.weight"

    def place(i, names, w_scaled, w_quant):
        """Splits stacked rows back into the named linears; the forward uses the quantized ones."""
        cuts = np.cumsum([original[name(i, n)].shape[0] for n in names])[:-1]
        for n, a, b in zip(names, np.split(w_scaled, cuts, 0), np.split(w_quant, cuts, 0)):
            scaled[name(i, n)] = a.astype(np.float32)
            quant[name(i, n)] = model.w[name(i, n)] = b.astype(np.float32)

    def stage(i, key, names, inputs, tie=lambda v: v):
        w = np.concatenate([original[name(i, n)] for n in names], 0).astype(np.float64)
        H = second_moment(inputs)
        s, alpha, rtn_err, err = search_scale(w, H, tie(mean_abs(inputs)), tie(weight_mean(w)) if duo else None)
        ws = w * s[None, :]
        # The inputs are divided by s: their second moment is H / (s s^T).
        q = awq_clip(ws, H / np.outer(s, s)) if clip else rtn_int4(ws, GROUP)
        place(i, names, ws, q)
        alphas[key].append(alpha)
        gains[key].append(round(output_error(w, q / s[None, :], H) / rtn_err, 4) if rtn_err > 0 else None)
        return s

    def scale_rows(i, n, s_rows):
        for d in (scaled, quant):
            d[name(i, n)] = (d[name(i, n)] / s_rows[:, None]).astype(np.float32)
        model.w[name(i, n)] = quant[name(i, n)]

    xs = [model.w["token_embd.weight"][calib[s:s + batch]] for s in range(0, len(calib), batch)]
    try:
        for i in range(model.layers):
            t = time.time()
            g = original[name(i, "attn_norm")].astype(np.float64)
            h = [model.rms_norm(x, model.L(i, "attn_norm")) for x in xs]
            s = stage(i, "qkv", ("attn_q", "attn_k", "attn_v"), h)
            scaled[name(i, "attn_norm")] = model.w[name(i, "attn_norm")] = (g / s).astype(np.float32)
            h = [(hb / s).astype(np.float32) for hb in h]
            a = [model.attention(i, hb) for hb in h]
            s = stage(i, "o", ("attn_output",), a, lambda v: tie_heads(v, model.kv_heads, group_q))
            scale_rows(i, "attn_v", s.reshape(model.kv_heads, group_q, -1)[:, 0].reshape(-1))
            a = [(ab / s).astype(np.float32) for ab in a]
            xs = [x + ab @ model.L(i, "attn_output").T for x, ab in zip(xs, a)]
            g = original[name(i, "ffn_norm")].astype(np.float64)
            h = [model.rms_norm(x, model.L(i, "ffn_norm")) for x in xs]
            s = stage(i, "gate_up", ("ffn_gate", "ffn_up"), h)
            scaled[name(i, "ffn_norm")] = model.w[name(i, "ffn_norm")] = (g / s).astype(np.float32)
            h = [(hb / s).astype(np.float32) for hb in h]
            m = [model.silu(hb @ model.L(i, "ffn_gate").T) * (hb @ model.L(i, "ffn_up").T) for hb in h]
            s = stage(i, "down", ("ffn_down",), m)
            scale_rows(i, "ffn_up", s)
            m = [(mb / s).astype(np.float32) for mb in m]
            xs = [x + mb @ model.L(i, "ffn_down").T for x, mb in zip(xs, m)]
            del h, a, m
            log(f"awq clip={clip} layer {i}: alpha " + " ".join(f"{k} {alphas[k][-1]:.2f} ({gains[k][-1]})" for k in STAGES)
                + f", {time.time() - t:.1f}s")
    finally:
        model.w = original
    return scaled, quant, alphas, gains


# ---------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, "int4_awq_quality")
    ap.add_argument("--variants", nargs="*", default=["rtn", "rtn-clip", "gptq-clip"],
                    choices=["rtn", "rtn-clip", "gptq-clip"],
                    help="AWQ then RTN g128, AWQ then RTN with AWQ's clip search, AWQ's scales (from the rtn pass) "
                         "then GPTQ act-order static groups + clip search")
    ap.add_argument("--scaling", choices=["x", "duo"], default="x",
                    help="x: AWQ's s = mean|x|^alpha; duo: AutoAWQ's mean|x|^alpha / mean|w|^(1 - alpha)")
    args = ap.parse_args()
    src = Path(args.gguf)
    commit = git_commit()
    duo = args.scaling == "duo"
    tag = " (duo scaling)" if duo else ""
    calib, description = calibration(args)
    model = Model(src)

    with tempfile.TemporaryDirectory(prefix="tessera-awq-") as tmp:
        space = Path(tmp) / "space.yaml"
        space.write_text(SPACE)
        reference = None

        def score(variant: str, scaled: dict | None, quantized: dict | None, t: float, fields: dict) -> float:
            """Writes the copy (scaled: the rewrite's changed tensors, unquantized; quantized: replacement
            linears) and scores it; appends the JSON line."""
            nonlocal reference
            path = Path(tmp) / "model.gguf"
            replace = {**(scaled or {}), **(quantized or {})}
            error = total = 0.0
            for n, q in (quantized or {}).items():
                error += float(((q.astype(np.float64) - scaled[n]) ** 2).sum())
                total += float((scaled[n].astype(np.float64) ** 2).sum())
            write_gguf(src, path, lambda n, w: replace.get(n))
            ppl = perplexity(args.tessera, path, space, Path(tmp) / "tune")
            path.unlink()
            reference = ppl if reference is None else reference
            line = {"bench": "int4_awq_quality", "model": src.name, "variant": variant, "group": GROUP, "scaling": args.scaling, **fields,
                    "weight_rel_l2": round((error / total) ** 0.5, 5) if total else 0.0,
                    "ppl": round(ppl, 4), "delta_ppl_pct": round(100 * (ppl / reference - 1), 2)}
            record(args.out, line, t, commit)
            return ppl

        def requant(quantized: dict) -> tuple[dict, float]:
            """The GPU loader's view (RTN g128 of the given weights) and its relative distance from them."""
            rq = {n: rtn_int4(q, GROUP).astype(np.float32) for n, q in quantized.items()}
            d = sum(float(((rq[n].astype(np.float64) - q) ** 2).sum()) for n, q in quantized.items())
            total = sum(float((q.astype(np.float64) ** 2).sum()) for q in quantized.values())
            return rq, (d / total) ** 0.5

        def score_both(label: str, scaled: dict, quantized: dict, t: float, fields: dict) -> None:
            score(label, scaled, quantized, t, fields)
            t = time.time()
            rq, dist = requant(quantized)
            score(label + ", RTN-requantized (the GPU loader's view)", scaled, rq, t,
                  {**fields, "requant_rel_l2": round(dist, 7)})

        score("f32 (reference)", None, None, time.time(), {"quantizer": None})
        t = time.time()
        scaled, quant, alphas, gains = awq_model(model, calib, clip=False, duo=duo)
        norm_gains = np.concatenate([scaled[n] for n in scaled if n.endswith("norm.weight")])
        fields = {"calibration": description, "alphas": alphas, "awq_error_vs_rtn": gains,
                  "scaled_norm_gain_abs_range": [float(np.abs(norm_gains).min()), float(np.abs(norm_gains).max())]}
        ppl = score("f32, AWQ-scaled (unquantized)" + tag, scaled, None, t, {"quantizer": None, **fields})
        if abs(ppl / reference - 1) * 100 > CHECK_PCT:
            sys.exit(f"AWQ-scaled F32 perplexity {ppl} is not the reference's {reference}; the rewrite is wrong")
        if "rtn" in args.variants:
            score_both("int4 g128 AWQ + RTN" + tag, scaled, quant, t, {"quantizer": "awq+rtn", **fields})
        del quant
        if "rtn-clip" in args.variants:
            t = time.time()
            c_scaled, c_quant, c_alphas, c_gains = awq_model(model, calib, clip=True, duo=duo)
            score_both("int4 g128 AWQ + RTN + AWQ clip search" + tag, c_scaled, c_quant, t,
                       {"quantizer": "awq+rtn+awq-clip", "calibration": description, "alphas": c_alphas,
                        "awq_error_vs_rtn": c_gains})
            del c_scaled, c_quant
        if "gptq-clip" in args.variants:
            t = time.time()
            base, model.w = model.w, {**model.w, **scaled}
            try:
                q = gptq_model(model, calib, act_order=True, clip=True)
            finally:
                model.w = base
            score_both("int4 g128 AWQ scales + GPTQ act-order static groups + clip search" + tag, scaled, q, t,
                       {"quantizer": "awq scales (rtn pass) + gptq act-order static groups + clip", **fields})


if __name__ == "__main__":
    main()
