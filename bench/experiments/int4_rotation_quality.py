#!/usr/bin/env python3
"""bench/experiments/int4_rotation_quality.py: does an offline rotation of the residual stream bring SmolLM2's int4_g128 within 8 %?

int4_group_quality.py measured +56 % perplexity for round-to-nearest (RTN) int4 in groups of 128 and
int4_gptq_quality.py +13 % for the best GPTQ. This script measures the QuaRot / SpinQuant idea in its
weight-only form, which needs no kernel change: an orthogonal Q (hidden x hidden) applied to the
residual stream, folded into the weights offline, so the int4 groups see weights whose outliers are
spread over all input channels.

The rewrite (row-vector convention, x' = x Q; a GGUF linear W is [out, in] and computes h W^T):
  1. each RMSNorm gain g is folded into the linears that read its output (W -> W diag(g): q/k/v take
     attn_norm, gate/up take ffn_norm, the lm_head takes output_norm) and the gain set to 1. SmolLM2
     ties the lm_head to token_embd, so the folded lm_head is written as an untied output.weight;
  2. token_embd E -> E Q; every linear reading the residual stream (q, k, v, gate, up, lm_head)
     W -> W Q; every linear writing it (attn_output, ffn_down) W -> Q^T W. A unit-gain RMSNorm
     commutes with an orthogonal Q, so the F32 model is unchanged: each rotated F32 copy is scored
     first and must match the reference within 0.1 %, else the script stops;
  3. optionally ("+vo") an orthogonal R per kv head inside attention: v's rows of head k -> R^T W_v,k,
     attn_output's input columns of every query head that reads kv head k -> W_o,j R.
The rotation between up/gate and down is left out (it needs an online transform of the activations).
Q is either "hadamard", a Hadamard matrix (Kronecker product of Paley order-12 and Sylvester factors;
576 = 12 x 12 x 4) with seeded random signs on its rows, scaled to be orthogonal, or "random", the
Q factor of a seeded Gaussian matrix (signs fixed so it is Haar distributed). "none" folds the norms
only (Q = I), which separates the fold's effect from the rotation's. R is a signed Sylvester
Hadamard of head_dim.

The 7 layer linears of each rotated copy are then fake-quantized as int4_group_quality.py does (g128,
RTN, with or without its clip search); token_embd and the lm_head stay F32 (the GPU keeps them
unquantized too). "gptq" runs int4_gptq_quality.py's GPTQ (act-order, static groups, clip search,
sequential calibration on 128 x 256 wiki tokens) on the rotated model, scored as GPTQ left it and
re-quantized by RTN g128 (the GPU loader's view). Every copy is an F32 GGUF scored with
`tessera tune` on the CPU backend (same space and 4,096 held-out tokens as the other two scripts).
One JSON line per variant, appended to bench/experiments/results/int4_rotation_quality.jsonl; weight_rel_l2 is
the quantized linears' relative L2 error against the rotated (unquantized) linears.

Needs the PyPI package gguf (pip install gguf==0.17.1), a CPU build of tessera, ~0.7 GB of disk per
variant and ~4 GB of memory. RTN variants take ~1 minute each on 2 cores, GPTQ ~3 minutes.
  python3 bench/experiments/int4_rotation_quality.py --tessera build-cpu/server/tessera \\
      --rotations none hadamard random hadamard+vo --gptq hadamard+vo
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from int4_group_quality import SPACE, is_linear, perplexity, rtn_int4, write_gguf  # noqa: E402
from int4_gptq_quality import GROUP, Model, add_common_args, calibration, git_commit, gptq_model, record  # noqa: E402

CHECK_PCT = 0.1  # a rotated F32 copy must score within this of the reference


# ---------------------------------------------------------------------------------------------------
# Orthogonal matrices


def paley_hadamard(q: int) -> np.ndarray:
    """Paley's construction I: a Hadamard matrix of order q + 1 for a prime q = 3 (mod 4)."""
    squares = {(x * x) % q for x in range(1, q)}
    chi = np.array([0] + [1 if a in squares else -1 for a in range(1, q)])
    jacobsthal = chi[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q]  # antisymmetric for q = 3 mod 4
    s = np.zeros((q + 1, q + 1), dtype=np.int64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jacobsthal
    return np.eye(q + 1, dtype=np.int64) + s


def hadamard(n: int) -> np.ndarray:
    """A +-1 Hadamard matrix of order n = 12^a * 2^b (Kronecker products of Paley-12 and Sylvester-2)."""
    h, m = np.ones((1, 1), dtype=np.int64), n
    while m % 12 == 0 and m > 1:
        h, m = np.kron(h, paley_hadamard(11)), m // 12
    while m % 2 == 0:
        h, m = np.kron(h, np.array([[1, 1], [1, -1]])), m // 2
    if m != 1:
        raise ValueError(f"no Hadamard construction here for order {n}")
    assert (h @ h.T == n * np.eye(n, dtype=np.int64)).all()
    return h


def orthogonal(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "none":
        return np.eye(n)
    if kind == "hadamard":
        return rng.choice([-1.0, 1.0], size=n)[:, None] * hadamard(n) / np.sqrt(n)
    if kind == "random":
        q, r = np.linalg.qr(rng.standard_normal((n, n)))
        return q * np.sign(np.diag(r))[None, :]
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------------------
# The rewrite


def rotate(model: Model, rotation: str, seed: int) -> dict[str, np.ndarray]:
    """All of the model's tensors after norm folding and rotation (float32), plus an untied output.weight."""
    rng = np.random.default_rng(seed)
    kind, vo = rotation.split("+")[0], rotation.endswith("+vo")
    Q = orthogonal(kind, model.hidden, rng)
    assert np.allclose(Q @ Q.T, np.eye(model.hidden), atol=1e-10)
    w = {k: v.astype(np.float64) for k, v in model.w.items()}
    ones = np.ones(model.hidden)
    out = {"token_embd.weight": w["token_embd.weight"] @ Q,
           "output.weight": (w.get("output.weight", w["token_embd.weight"]) * w["output_norm.weight"][None, :]) @ Q,
           "output_norm.weight": ones}
    hd, group = model.head_dim, model.heads // model.kv_heads
    for i in range(model.layers):
        p = f"blk.{i}."
        wv, wo = w[p + "attn_v.weight"].copy(), w[p + "attn_output.weight"].copy()
        if vo:
            for k in range(model.kv_heads):
                R = orthogonal("hadamard", hd, rng)
                wv[k * hd:(k + 1) * hd] = R.T @ wv[k * hd:(k + 1) * hd]
                for j in range(k * group, (k + 1) * group):  # query head j reads kv head j // group
                    wo[:, j * hd:(j + 1) * hd] = wo[:, j * hd:(j + 1) * hd] @ R
        g = w[p + "attn_norm.weight"][None, :]
        out[p + "attn_q.weight"] = (w[p + "attn_q.weight"] * g) @ Q
        out[p + "attn_k.weight"] = (w[p + "attn_k.weight"] * g) @ Q
        out[p + "attn_v.weight"] = (wv * g) @ Q
        out[p + "attn_output.weight"] = Q.T @ wo
        g = w[p + "ffn_norm.weight"][None, :]
        out[p + "ffn_gate.weight"] = (w[p + "ffn_gate.weight"] * g) @ Q
        out[p + "ffn_up.weight"] = (w[p + "ffn_up.weight"] * g) @ Q
        out[p + "ffn_down.weight"] = Q.T @ w[p + "ffn_down.weight"]
        out[p + "attn_norm.weight"] = out[p + "ffn_norm.weight"] = ones
    assert set(out) == set(w) | {"output.weight"}, set(w) ^ set(out)
    return {k: v.astype(np.float32) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, "int4_rotation_quality")
    rotations = ["none", "hadamard", "random", "hadamard+vo", "random+vo"]
    ap.add_argument("--rotations", nargs="*", default=["none", "hadamard", "random", "hadamard+vo"], choices=rotations,
                    help="each is scored as F32 (the check), int4 g128 RTN and RTN + clip search")
    ap.add_argument("--gptq", nargs="*", default=[], choices=rotations,
                    help="rotations also quantized by GPTQ act-order static groups + clip search")
    ap.add_argument("--no-clip", action="store_true", help="skip the RTN + clip search variants")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    src = Path(args.gguf)
    commit = git_commit()
    model = Model(src)
    original = model.w
    calib, description = calibration(args) if args.gptq else (None, None)

    with tempfile.TemporaryDirectory(prefix="tessera-rot-") as tmp:
        space = Path(tmp) / "space.yaml"
        space.write_text(SPACE)
        reference = None

        def score(variant: str, rotation: str | None, weights: dict[str, np.ndarray] | None,
                  quantized: dict[str, np.ndarray] | None, t: float, extra_fields: dict) -> float:
            """Writes the copy (weights: every tensor, or None for the source as is; quantized: replacement
            linears) and scores it; appends the JSON line."""
            nonlocal reference
            path = Path(tmp) / "model.gguf"
            error = total = 0.0
            for name, q in (quantized or {}).items():
                error += float(((q.astype(np.float64) - weights[name]) ** 2).sum())
                total += float((weights[name].astype(np.float64) ** 2).sum())

            def transform(name: str, w: np.ndarray):
                if quantized is not None and name in quantized:
                    return quantized[name]
                return None if weights is None else weights[name]

            extra = None if weights is None or "output.weight" in original else {"output.weight": weights["output.weight"]}
            write_gguf(src, path, transform, extra)
            ppl = perplexity(args.tessera, path, space, Path(tmp) / "tune")
            path.unlink()
            reference = ppl if reference is None else reference
            line = {"bench": "int4_rotation_quality", "model": src.name, "variant": variant, "rotation": rotation,
                    "seed": None if rotation in (None, "none") else args.seed, "group": GROUP,
                    **extra_fields, "weight_rel_l2": round((error / total) ** 0.5, 5) if total else 0.0,
                    "ppl": round(ppl, 4), "delta_ppl_pct": round(100 * (ppl / reference - 1), 2)}
            record(args.out, line, t, commit)
            return ppl

        score("f32 (reference)", None, None, None, time.time(), {"quantizer": None})
        for rotation in dict.fromkeys(args.rotations + args.gptq):
            t = time.time()
            weights = rotate(model, rotation, args.seed)
            name = "norms folded" if rotation == "none" else f"norms folded, rotated {rotation}"
            ppl = score(f"f32, {name}", rotation, weights, None, t, {"quantizer": None})
            if abs(ppl / reference - 1) * 100 > CHECK_PCT:
                sys.exit(f"rotation {rotation}: F32 perplexity {ppl} is not the reference's {reference}; the rewrite is wrong")
            linears = [n for n in weights if is_linear(n)]
            if rotation in args.rotations:
                for clip in [False] if args.no_clip else [False, True]:
                    t = time.time()
                    q = {n: rtn_int4(weights[n], GROUP, clip) for n in linears}
                    score(f"int4 g128 RTN{' + clip search' if clip else ''}, {name}", rotation, weights, q, t,
                          {"quantizer": "rtn" + ("+clip" if clip else "")})
            if rotation in args.gptq:
                t = time.time()
                # A copy: gptq_model writes the quantized linears into model.w as it goes.
                model.w, model.lm_head = dict(weights), weights["output.weight"]
                try:
                    q = gptq_model(model, calib, act_order=True, clip=True)
                finally:
                    model.w, model.lm_head = original, original.get("output.weight", original["token_embd.weight"])
                fields = {"quantizer": "gptq act-order static groups + clip",
                          "calibration": description}
                label = f"int4 g128 GPTQ act-order static groups + clip search, {name}"
                score(label, rotation, weights, q, t, fields)
                t = time.time()
                score(label + ", RTN-requantized (the GPU loader's view)", rotation, weights,
                      {n: rtn_int4(q[n], GROUP) for n in linears}, t, fields)


if __name__ == "__main__":
    main()
