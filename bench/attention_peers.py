#!/usr/bin/env python3
"""bench/attention_peers.py: the PyTorch peers of tessera-bench, run in the same device call.

Prints one JSON line per (peer, case), the same fields as tessera-bench:
  {impl, case, shape, median_ms, p10_ms, p90_ms, tflops|gbps, device, commit}
Peers: torch SDPA with the FLASH_ATTENTION and CUDNN_ATTENTION backends (causal cases), FlexAttention
through torch.compile with the same masks (block masks built once, outside timing), and add+RMSNorm
in eager PyTorch and torch.compile. CUDA events, warm-up, median and p10/p90 of >= 30 samples.

  python3 bench/attention_peers.py [--only SUBSTRING]     (commit from $TESSERA_COMMIT)
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

DEVICE = torch.cuda.get_device_name(0)
COMMIT = os.environ.get("TESSERA_COMMIT", "unknown")
SAMPLES = 30


def time_launches(fn):
    """Median/p10/p90 ms per call; each sample spans ~1 ms of back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    reps = max(1, min(1000, int(1.0 / max(start.elapsed_time(stop), 1e-4))))
    samples = []
    for _ in range(SAMPLES):
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / reps)
    samples.sort()
    pct = lambda p: samples[int(round(p * (len(samples) - 1)))]
    return pct(0.5), pct(0.1), pct(0.9)


def time_graph(fn, per_graph=100):
    """Per call, for per_graph calls captured into one CUDA graph and replayed (tessera-bench's
    time_graph): the launch-bound sizes without the host's per-call cost."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    return tuple(t / per_graph for t in time_launches(graph.replay))


def emit(impl, case, shape, timing, rate_key, rate):
    med, p10, p90 = timing
    print(json.dumps({"impl": impl, "case": case, "shape": shape, "median_ms": round(med, 5),
                      "p10_ms": round(p10, 5), "p90_ms": round(p90, 5), rate_key: round(rate, 2),
                      "device": DEVICE, "commit": COMMIT}), flush=True)


def visible_pairs(kind, seqlen, window=0, documents=0):
    """Same count as tessera-bench: unmasked (q, k) pairs of one sequence."""
    if kind == "causal":
        return seqlen * (seqlen + 1) / 2
    if kind == "bidirectional":
        return seqlen * seqlen
    if kind == "sliding":
        return sum(min(q + 1, window) for q in range(seqlen))
    doc = seqlen // documents
    return documents * doc * (doc + 1) / 2


CASES = [
    # name, B, S, H, D, kind, window, documents
    ("causal_hd128_b4_s4096", 4, 4096, 32, 128, "causal", 0, 0),
    ("causal_hd128_b2_s8192", 2, 8192, 32, 128, "causal", 0, 0),
    ("causal_hd64_b4_s4096", 4, 4096, 32, 64, "causal", 0, 0),
    ("sliding1024_hd128_b4_s4096", 4, 4096, 32, 128, "sliding", 1024, 0),
    ("sliding1024_hd128_b2_s8192", 2, 8192, 32, 128, "sliding", 1024, 0),
    ("doc8_causal_hd128_b2_s8192", 2, 8192, 32, 128, "documents", 0, 8),
    # BERT-base's encoder attention: one text, and a batch.
    ("bert_bidir_hd64_b1_s128_fp16", 1, 128, 12, 64, "bidirectional", 0, 0),
    ("bert_bidir_hd64_b128_s128_fp16", 128, 128, 12, 64, "bidirectional", 0, 0),
]
# The H100 table of FlashAttention-3's paper (causal), in both 16-bit types: tessera-bench's seed_ cases.
for _suffix in ("fp16", "bf16"):
    CASES += [
        (f"seed_causal_hd64_b4_h32_s4096_{_suffix}", 4, 4096, 32, 64, "causal", 0, 0),
        (f"seed_causal_hd128_b2_h16_s8192_{_suffix}", 2, 8192, 16, 128, "causal", 0, 0),
        (f"seed_causal_hd256_b1_h8_s16384_{_suffix}", 1, 16384, 8, 256, "causal", 0, 0),
    ]

flex_compiled = torch.compile(flex_attention, dynamic=False)


def bench_attention(case):
    name, B, S, H, D, kind, window, documents = case
    dtype = torch.float16 if name.endswith("_fp16") else torch.bfloat16
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(3))
    shape = f"B{B} H{H} S{S} D{D}"
    flops = 4.0 * D * H * B * visible_pairs(kind, S, window, documents)
    if kind in ("causal", "bidirectional"):
        for impl, backend in (("torch-sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("torch-sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    t = time_launches(
                        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=kind == "causal"))
                emit(impl, name, shape, t, "tflops", flops / (t[0] * 1e-3) / 1e12)
            except RuntimeError as err:  # a backend that refuses the shape is reported, not fatal
                print(f"skip {impl}/{name}: {err}", file=sys.stderr)
    if kind == "causal":
        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
    elif kind == "bidirectional":
        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx >= 0
    elif kind == "sliding":
        # window counts q itself: q - window < k <= q
        def mask_mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    else:
        doc_id = (torch.arange(S, device="cuda") // (S // documents)).to(torch.int32)

        def mask_mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (doc_id[q_idx] == doc_id[kv_idx])
    block_mask = create_block_mask(mask_mod, None, None, S, S, device="cuda")
    try:
        t = time_launches(lambda: flex_compiled(q, k, v, block_mask=block_mask))
        emit("torch-flex", name, shape, t, "tflops", flops / (t[0] * 1e-3) / 1e12)
    except Exception as err:  # noqa: BLE001 - Triton's refusals (shared memory, shapes) vary by type
        print(f"skip torch-flex/{name}: {err}", file=sys.stderr)


def add_rmsnorm(x, residual, weight, eps=1e-6):
    residual = x + residual
    r = residual.float()
    out = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return out, residual


add_rmsnorm_compiled = torch.compile(add_rmsnorm)


def bench_add_rmsnorm(tokens):
    hidden = 4096
    name = f"add_rmsnorm_t{tokens}"
    elems = tokens * hidden
    sets = max(1, min(64, (256 << 20) // (elems * 4)))  # leave L2, as tessera-bench does
    xs = [torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    rs = [torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    nbytes = 4.0 * elems * 2 + hidden * 2
    for impl, fn in (("torch-eager", add_rmsnorm), ("torch-compile", add_rmsnorm_compiled)):
        counter = [0]

        def step():
            i = counter[0] % sets
            counter[0] += 1
            fn(xs[i], rs[i], w)
        t = time_launches(step)
        emit(impl, name, f"T{tokens} hidden{hidden}", t, "gbps", nbytes / (t[0] * 1e-3) / 1e9)
        if tokens <= 64:
            g = time_graph(step)
            emit(impl, name + "_graph", f"T{tokens} hidden{hidden}", g, "gbps", nbytes / (g[0] * 1e-3) / 1e9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    for case in CASES:
        if args.only in case[0]:
            bench_attention(case)
    for tokens in (1, 64, 4096, 16384):
        if args.only in f"add_rmsnorm_t{tokens}":
            bench_add_rmsnorm(tokens)


if __name__ == "__main__":
    main()
