#!/usr/bin/env python3
"""bench/experiments/int4_gptq_quality.py: does GPTQ bring SmolLM2's int4_g128 perplexity within 8 % of the reference?

int4_group_quality.py showed that round-to-nearest (RTN) re-quantization of SmolLM2's Q4_1 linears to
asymmetric int4 in groups of 128 costs +56 % perplexity. This script measures the calibrated
alternative, GPTQ (Frantar et al. 2022), on the same format: per linear layer, H = 2 X^T X from
calibration inputs X, dampened by 1 % of its mean diagonal; columns quantized in order with the
error fed back through the Cholesky factor of H^-1 (lazy batches of 128); each 128-wide group's
scale = (max - min) / 15 and zero = min chosen when the column loop enters the group, from the
error-updated weights. Act-order ("act" variants) visits columns in order of descending diag(H) with
each group's parameters fixed before the loop from the original weights ("static groups", as
AutoGPTQ's option), so the groups stay contiguous in the original column order, as the GPU's format
needs. "clip" variants pick each group's [min, max] with int4_group_quality.py's clip search instead.

Calibration is sequential: a numpy forward pass of the model (Llama architecture, hyperparameters from
the GGUF metadata) over 128 sequences of 256 tokens of wiki.utf8 starting past its first 100,000
characters of prose (the evaluation reads only the first ~37,000); each linear's inputs come from the
already-quantized layers before it (q/k/v share one Hessian, so do gate/up). The numpy forward is
checked first: its perplexity on the evaluation tokens must match `tessera tune`'s F32 reference
within 0.5 %, else the script stops.

Each variant is written as an F32 GGUF and scored with `tessera tune` on the CPU backend exactly as in
int4_group_quality.py (same space, same 4,096 held-out tokens, windows of 512): the F32 reference,
RTN g128, then each GPTQ variant twice: as GPTQ left it, and re-quantized by RTN g128, which is what
the GPU's loader (it derives each group's min/max from the weights it is given) would make of it,
since error feedback leaves groups whose values no longer span the grid the group was entered with.
One JSON line per variant, appended to bench/experiments/results/int4_gptq_quality.jsonl.

Needs the PyPI package gguf (pip install gguf==0.17.1), a CPU build of tessera, ~0.55 GB of disk per
variant and ~4 GB of memory. About 15 minutes on 2 cores (--variants picks fewer).
  python3 bench/experiments/int4_gptq_quality.py --tessera build-cpu/server/tessera
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from int4_group_quality import (GGUF, MODEL_DIR, REPO, SPACE, int4_qdq, int4_range, is_linear, perplexity,  # noqa: E402
                                rtn_int4, write_gguf)
from calibrate_int4 import prose, tokenize  # noqa: E402  (tuner/, on the path via int4_group_quality)

WIKI = MODEL_DIR / "eval-text-wiki/wiki.utf8"
EVAL_TOKENS, EVAL_WINDOW = 4096, 512  # SPACE's quality: tokens and window
GROUP = 128
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Text and tokens


def add_common_args(ap: argparse.ArgumentParser, results: str) -> None:
    """The options the calibrated int4 scripts share; results names the JSON-lines file in bench/results."""
    ap.add_argument("--tessera", default=str(REPO / "build-cpu/server/tessera"))
    ap.add_argument("--gguf", default=str(GGUF))
    ap.add_argument("--sequences", type=int, default=128, help="calibration sequences")
    ap.add_argument("--length", type=int, default=256, help="calibration sequence length")
    ap.add_argument("--skip-chars", type=int, default=100_000, help="calibration starts past this much prose")
    ap.add_argument("--out", default=str(REPO / f"bench/experiments/results/{results}.jsonl"))


def git_commit() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def record(out: str, line: dict, t: float, commit: str) -> None:
    """Completes a result line (seconds since t, date, commit, load average), prints it and appends it to out."""
    line = {**line, "seconds": round(time.time() - t, 1),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": commit, "loadavg": round(os.getloadavg()[0], 2)}
    print(json.dumps(line), flush=True)
    with open(out, "a") as f:
        f.write(json.dumps(line) + "\n")


def eval_and_calibration_tokens(tessera: str, model: Path, sequences: int, length: int, skip_chars: int):
    text = prose(WIKI)
    # tuner/measure.cpp: whole lines until the text holds tokens * 8 + 4096 characters.
    want, end = EVAL_TOKENS * 8 + 4096, 0
    while end < want:
        end = text.index("\n", end) + 1
    assert skip_chars >= end, "calibration text must not overlap the evaluation text"
    start = text.index("\n", skip_chars) + 1  # from a line start past skip_chars
    # ~4 characters a token; 1.5x headroom, tokenized in one piece so no chunk boundary is odd.
    calib_text = text[start:start + int(sequences * length * 4 * 1.5)]
    eval_ids, calib_ids = tokenize(tessera, model, [text[:end], calib_text])
    assert len(eval_ids) >= EVAL_TOKENS and len(calib_ids) >= sequences * length, (len(eval_ids), len(calib_ids))
    log(f"eval text {end} chars -> {len(eval_ids)} tokens; calibration chars {start}..{start + len(calib_text)} "
        f"-> {len(calib_ids)} tokens, using {sequences} x {length}")
    calib = np.array(calib_ids[:sequences * length], dtype=np.int64).reshape(sequences, length)
    return np.array(eval_ids[:EVAL_TOKENS], dtype=np.int64), calib


def calibration(args: argparse.Namespace) -> tuple[np.ndarray, str]:
    """add_common_args' calibration tokens [sequences, length] and their description for the result lines."""
    _, calib = eval_and_calibration_tokens(args.tessera, Path(args.gguf), args.sequences, args.length, args.skip_chars)
    return calib, f"{args.sequences}x{args.length} wiki tokens past char {args.skip_chars}, sequential"


# ---------------------------------------------------------------------------------------------------
# The model, in numpy


class Model:
    def __init__(self, path: Path):
        import gguf

        reader = gguf.GGUFReader(path)
        field = lambda k: reader.fields[k].contents()  # noqa: E731
        arch = field("general.architecture")
        assert arch == "llama", arch
        self.layers = int(field("llama.block_count"))
        self.hidden = int(field("llama.embedding_length"))
        self.heads = int(field("llama.attention.head_count"))
        self.kv_heads = int(field("llama.attention.head_count_kv"))
        self.head_dim = self.hidden // self.heads
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(field("llama.rope.freq_base"))
        assert int(field("llama.rope.dimension_count")) == self.head_dim
        # Q4_1 / Q8_0 dequantized once to float32: the F32 GGUF that tessera scores holds the same values.
        self.w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32) for t in reader.tensors}
        # SmolLM2 ties the output projection to the embedding when the GGUF has no output.weight.
        self.lm_head = self.w.get("output.weight", self.w["token_embd.weight"])
        log(f"model: {self.layers} layers, hidden {self.hidden}, {self.heads}/{self.kv_heads} heads of "
            f"{self.head_dim}, ffn {self.w['blk.0.ffn_up.weight'].shape[0]}, eps {self.eps}, theta {self.theta}, "
            f"tied {'output.weight' not in self.w}")

    def L(self, i: int, name: str) -> np.ndarray:
        return self.w[f"blk.{i}.{name}.weight"]

    def rms_norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        var = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
        return x / np.sqrt(var + self.eps) * w

    def rope(self, x: np.ndarray) -> np.ndarray:
        """x [B, T, H, D]. The GGUF converter permutes q/k rows so llama.cpp's rope rotates adjacent pairs
        (2i, 2i+1) by angle pos * theta^(-2i/D)."""
        T, D = x.shape[1], x.shape[3]
        angle = np.arange(T, dtype=np.float64)[:, None] * self.theta ** (-np.arange(0, D, 2) / D)
        cos = np.cos(angle).astype(np.float32)[None, :, None, :]
        sin = np.sin(angle).astype(np.float32)[None, :, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def attention(self, i: int, h: np.ndarray) -> np.ndarray:
        """Causal GQA attention of the normed input h [B, T, hidden] -> the input of attn_output."""
        B, T, _ = h.shape
        q = self.rope((h @ self.L(i, "attn_q").T).reshape(B, T, self.heads, self.head_dim)).transpose(0, 2, 1, 3)
        k = self.rope((h @ self.L(i, "attn_k").T).reshape(B, T, self.kv_heads, self.head_dim)).transpose(0, 2, 1, 3)
        v = (h @ self.L(i, "attn_v").T).reshape(B, T, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        group = self.heads // self.kv_heads  # query head j reads kv head j // group
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        out = np.empty_like(q)
        for b in range(B):  # one sequence at a time keeps the [heads, T, T] scores small
            s = q[b] @ k[b].transpose(0, 2, 1) / np.float32(np.sqrt(self.head_dim)) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[b] = (s / s.sum(-1, keepdims=True)) @ v[b]
        return out.transpose(0, 2, 1, 3).reshape(B, T, self.hidden)

    @staticmethod
    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.exp(-x))

    def block(self, i: int, x: np.ndarray) -> np.ndarray:
        """One pre-norm decoder layer: x + attention(norm(x)), then + down(silu(gate) * up)(norm(x))."""
        x = x + self.attention(i, self.rms_norm(x, self.L(i, "attn_norm"))) @ self.L(i, "attn_output").T
        h = self.rms_norm(x, self.L(i, "ffn_norm"))
        return x + (self.silu(h @ self.L(i, "ffn_gate").T) * (h @ self.L(i, "ffn_up").T)) @ self.L(i, "ffn_down").T

    def perplexity(self, ids: np.ndarray, window: int) -> float:
        """As tuner/measure.cpp scores: independent windows from position 0, every next token predicted."""
        nll, n = 0.0, 0
        for w in range(len(ids) // window):
            seq = ids[w * window:(w + 1) * window]
            x = self.w["token_embd.weight"][seq][None]
            for i in range(self.layers):
                x = self.block(i, x)
            logits = (self.rms_norm(x, self.w["output_norm.weight"])[0] @ self.lm_head.T).astype(np.float64)
            top = logits.max(-1, keepdims=True)
            logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
            nll -= logp[np.arange(window - 1), seq[1:]].sum()
            n += window - 1
        return float(np.exp(nll / n))


# ---------------------------------------------------------------------------------------------------
# GPTQ


def gptq(w: np.ndarray, H: np.ndarray, group: int = GROUP, damp: float = 0.01, act_order: bool = False,
         clip: bool = False, block: int = 128) -> np.ndarray:
    """GPTQ of w [out, in] against the Hessian H [in, in] (float64); returns the fake-quantized weight."""
    W = w.astype(np.float64)  # a copy
    H = H.copy()
    cols = W.shape[1]
    dead = np.diag(H) == 0  # an input that is always 0: its weights cannot matter; keep H invertible
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    if act_order:
        # Static groups: each contiguous group's [min, max] from the original weights, before any update,
        # because with columns visited out of order there is no "moment the loop enters a group".
        ranges = [int4_range(W[:, s:s + group], clip) for s in range(0, cols, group)]
        lo, hi = np.concatenate([r[0] for r in ranges], 1), np.concatenate([r[1] for r in ranges], 1)
        perm = np.argsort(-np.diag(H), kind="stable")
    else:
        perm = np.arange(cols)
    W, H = W[:, perm], H[perm][:, perm]
    H[np.diag_indices(cols)] += damp * np.mean(np.diag(H))
    # U, the upper Cholesky factor of H^-1: row i holds the error feedback of column i onto later columns.
    L = np.linalg.cholesky(H)
    Linv = np.linalg.solve(L, np.eye(cols))
    U = np.linalg.cholesky(Linv.T @ Linv).T
    Q = np.zeros_like(W)
    for b1 in range(0, cols, block):
        b2 = min(cols, b1 + block)
        W1, E1, U1 = W[:, b1:b2].copy(), np.zeros((W.shape[0], b2 - b1)), U[b1:b2, b1:b2]
        for j in range(b2 - b1):
            c = b1 + j  # position in the visiting order
            if act_order:
                g = perm[c] // group
                glo, ghi = lo[:, g], hi[:, g]
            elif c % group == 0:
                # Entering a group: its range from the weights as the earlier columns' errors left them
                # (those inside this lazy block live in W1, the rest of the group in W).
                cur = np.concatenate([W1[:, j:], W[:, b2:c + group]], 1)[:, :group]
                glo, ghi = (r[:, 0] for r in int4_range(cur, clip))
            q = int4_qdq(W1[:, j], glo, ghi)
            Q[:, c] = q
            err = (W1[:, j] - q) / U1[j, j]
            W1[:, j:] -= np.outer(err, U1[j, j:])
            E1[:, j] = err
        W[:, b2:] -= E1 @ U[b1:b2, b2:]  # the lazy update of the columns after this block
    out = np.empty_like(Q)
    out[:, perm] = Q
    return out


def gptq_model(model: Model, calib: np.ndarray, act_order: bool, clip: bool, batch: int = 16) -> dict[str, np.ndarray]:
    """Sequential GPTQ over all layers; returns the quantized linears by tensor name. model.w is restored.
    Each linear group's calibration inputs come from the forward with every earlier group (this layer's
    included) already quantized; the stages follow Model.block."""
    original = dict(model.w)
    result = {}

    def hessian(chunks: list[np.ndarray]) -> np.ndarray:
        H, n = 0.0, 0
        for c in chunks:
            flat = c.reshape(-1, c.shape[-1])
            H = H + (flat.T @ flat).astype(np.float64)  # float32 GEMM per batch, summed in float64
            n += len(flat)
        return 2.0 * H / n

    def quantize(i: int, names: tuple[str, ...], inputs: list[np.ndarray]) -> None:
        rows = [model.L(i, n) for n in names]  # GPTQ treats rows independently: q/k/v share H, as gate/up
        q = gptq(np.concatenate(rows, 0), hessian(inputs), act_order=act_order, clip=clip).astype(np.float32)
        for n, part in zip(names, np.split(q, np.cumsum([r.shape[0] for r in rows])[:-1], 0)):
            model.w[f"blk.{i}.{n}.weight"] = result[f"blk.{i}.{n}.weight"] = part

    xs = [model.w["token_embd.weight"][calib[s:s + batch]] for s in range(0, len(calib), batch)]
    try:
        for i in range(model.layers):
            t = time.time()
            h = [model.rms_norm(x, model.L(i, "attn_norm")) for x in xs]
            quantize(i, ("attn_q", "attn_k", "attn_v"), h)
            a = [model.attention(i, hb) for hb in h]
            quantize(i, ("attn_output",), a)
            xs = [x + ab @ model.L(i, "attn_output").T for x, ab in zip(xs, a)]
            h = [model.rms_norm(x, model.L(i, "ffn_norm")) for x in xs]
            quantize(i, ("ffn_gate", "ffn_up"), h)
            m = [model.silu(hb @ model.L(i, "ffn_gate").T) * (hb @ model.L(i, "ffn_up").T) for hb in h]
            quantize(i, ("ffn_down",), m)
            xs = [x + mb @ model.L(i, "ffn_down").T for x, mb in zip(xs, m)]
            del h, a, m
            log(f"gptq act_order={act_order} clip={clip} layer {i}: {time.time() - t:.1f}s")
    finally:
        model.w = original
    return result


# ---------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, "int4_gptq_quality")
    ap.add_argument("--variants", nargs="*", default=["gptq", "gptq-clip", "gptq-act", "gptq-act-clip"],
                    choices=["gptq", "gptq-clip", "gptq-act", "gptq-act-clip"],
                    help="GPTQ variants: in column order or act-order (static groups), group ranges from min/max "
                         "or the clip search of int4_group_quality.py")
    args = ap.parse_args()
    src = Path(args.gguf)
    commit = git_commit()

    eval_ids, calib = eval_and_calibration_tokens(args.tessera, src, args.sequences, args.length, args.skip_chars)
    model = Model(src)
    numpy_ppl = model.perplexity(eval_ids, EVAL_WINDOW)
    log(f"numpy forward perplexity on the eval tokens: {numpy_ppl:.4f}")

    # A variant: None (the F32 reference), "rtn", or GPTQ's options; each GPTQ variant is also scored
    # re-quantized by RTN g128, as the GPU's loader would treat the F32 weights it is given.
    variants: list[tuple[str, object]] = [("f32 (reference)", None), ("int4 g128 RTN", "rtn")]
    for name in args.variants:
        act_order, clip = "act" in name, "clip" in name
        label = "int4 g128 GPTQ" + (" act-order static groups" if act_order else "") + (" + clip search" if clip else "")
        variants += [(label, (act_order, clip, False)), (label + ", RTN-requantized (the GPU loader's view)",
                                                         (act_order, clip, True))]
    gptq_weights: dict[tuple[bool, bool], dict[str, np.ndarray]] = {}

    def transform(kind):
        if kind is None:
            return lambda name, w: None
        if kind == "rtn":
            return lambda name, w: rtn_int4(w, GROUP) if is_linear(name) else None
        act_order, clip, requant = kind
        if (act_order, clip) not in gptq_weights:
            gptq_weights[(act_order, clip)] = gptq_model(model, calib, act_order, clip)
        # Each GPTQ variant's re-quantized view comes right after it: its weights are not needed later.
        weights = gptq_weights.pop((act_order, clip)) if requant else gptq_weights[(act_order, clip)]
        return lambda name, w: (rtn_int4(weights[name], GROUP) if requant else weights[name]) if is_linear(name) else None

    with tempfile.TemporaryDirectory(prefix="tessera-gptq-") as tmp:
        space = Path(tmp) / "space.yaml"
        space.write_text(SPACE)
        reference = None
        for k, (variant, kind) in enumerate(variants):
            t = time.time()
            model_path = Path(tmp) / "model.gguf"
            weight_error = write_gguf(src, model_path, transform(kind))
            ppl = perplexity(args.tessera, model_path, space, Path(tmp) / f"tune-{k}")
            model_path.unlink()
            if reference is None:
                reference = ppl
                # The numpy forward made the calibration activations: it has to be the model tessera runs.
                agree = abs(numpy_ppl / ppl - 1) * 100
                log(f"tessera f32 reference {ppl:.4f}, numpy {numpy_ppl:.4f}: {agree:.3f} % apart")
                if agree > 0.5:
                    sys.exit("the numpy forward disagrees with tessera by more than 0.5 %; not trusting GPTQ")
            line = {"bench": "int4_gptq_quality", "model": src.name, "variant": variant, "group": GROUP,
                    "calibration": None if kind in (None, "rtn") else
                    f"{args.sequences}x{args.length} wiki tokens past char {args.skip_chars}, sequential",
                    "weight_rel_l2": round(weight_error, 5), "ppl": round(ppl, 4),
                    "delta_ppl_pct": round(100 * (ppl / reference - 1), 2),
                    "numpy_forward_ppl": round(numpy_ppl, 4) if k == 0 else None}
            record(args.out, line, t, commit)


if __name__ == "__main__":
    main()
