#!/usr/bin/env python3
"""bench/summarize.py: the comparison table from tessera-bench + attention_peers.py JSON lines.

  python3 bench/summarize.py bench/results/<file>.jsonl

One row per case: Tessera's median, each peer's median, and peer_ms / tessera_ms (> 1: Tessera is
faster). Decode rows compare bandwidth with the D2D copy measured in the same run.
"""
import json
import sys
from collections import defaultdict


def main(path):
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    by_case = defaultdict(dict)
    for r in rows:
        by_case[r["case"]][r["impl"]] = r
    copy = by_case.get("d2d_copy", {}).get("cudaMemcpy")
    device = rows[0]["device"] if rows else "?"
    commit = rows[0]["commit"] if rows else "?"
    print(f"device: {device}   commit: {commit}\n")
    print("| case | shape | tessera ms | tessera rate | peer | peer ms | peer rate | peer/tessera |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for case, impls in by_case.items():
        if case == "d2d_copy":
            continue
        t = impls.get("tessera")
        if t is None:
            continue
        rate_key = "tflops" if "tflops" in t else "gbps"
        unit = "TFLOP/s" if rate_key == "tflops" else "GB/s"
        peers = [(k, v) for k, v in impls.items() if k != "tessera"]
        if not peers and copy is not None and "gbps" in t:
            frac = t["gbps"] / copy["gbps"]
            print(f"| {case} | {t['shape']} | {t['median_ms']:.4f} | {t['gbps']:.0f} GB/s | D2D copy | - | "
                  f"{copy['gbps']:.0f} GB/s | {frac:.0%} of copy |")
        for name, p in peers:
            print(f"| {case} | {t['shape']} | {t['median_ms']:.4f} | {t[rate_key]:.1f} {unit} | {name} | "
                  f"{p['median_ms']:.4f} | {p.get(rate_key, 0):.1f} {unit} | {p['median_ms'] / t['median_ms']:.2f}x |")
    if copy is not None:
        print(f"\nD2D copy (read + write): {copy['gbps']:.0f} GB/s, {copy['median_ms']:.3f} ms per GiB")
    print_bars(by_case, copy)


def print_bars(by_case, copy):
    """The bars (must / goal) the kernels are held to, evaluated on this run's numbers."""
    def ratio(case, peer):
        t, p = by_case.get(case, {}).get("tessera"), by_case.get(case, {}).get(peer)
        return None if t is None or p is None else p["median_ms"] / t["median_ms"]

    rows = []
    for case in ("causal_hd128_b4_s4096", "causal_hd128_b2_s8192", "causal_hd64_b4_s4096"):
        flex, cudnn = ratio(case, "torch-flex"), ratio(case, "torch-sdpa-cudnn")
        rows.append((case, "tessera >= FlexAttention", flex, flex is not None and flex >= 1.0,
                     "tessera >= cuDNN", cudnn, cudnn is not None and cudnn >= 1.0))
    for case in ("sliding1024_hd128_b4_s4096", "sliding1024_hd128_b2_s8192", "doc8_causal_hd128_b2_s8192"):
        flex = ratio(case, "torch-flex")
        rows.append((case, "tessera >= FlexAttention", flex, flex is not None and flex >= 1.0,
                     "1.5x FlexAttention", flex, flex is not None and flex >= 1.5))
    for case, impls in by_case.items():
        if case.startswith("decode") and "tessera" in impls and copy is not None:
            frac = impls["tessera"]["gbps"] / copy["gbps"]
            rows.append((case, ">= 70% of copy", frac, frac >= 0.70, ">= 85% of copy", frac, frac >= 0.85))
    for tokens in (4096, 16384):
        case = f"add_rmsnorm_t{tokens}"
        comp = ratio(case, "torch-compile")
        t = by_case.get(case, {}).get("tessera")
        frac = t["gbps"] / copy["gbps"] if t is not None and copy is not None else None
        rows.append((case, ">= torch.compile", comp, comp is not None and comp >= 1.0,
                     ">= 95% of copy", frac, frac is not None and frac >= 0.95))
    for case in ("add_rmsnorm_t1", "add_rmsnorm_t64", "add_rmsnorm_t1_graph", "add_rmsnorm_t64_graph"):
        t = by_case.get(case, {}).get("tessera")  # _graph: the same launches inside a CUDA graph
        us = t["median_ms"] * 1000 if t is not None else None
        rows.append((case, "<= 5 us", us, us is not None and us <= 5.0, "<= 3 us", us, us is not None and us <= 3.0))
    print("\n| case | must | value | held | goal | value | held |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case, must, mv, mh, goal, gv, gh in rows:
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        print(f"| {case} | {must} | {fmt(mv)} | {'yes' if mh else 'NO'} | {goal} | {fmt(gv)} | {'yes' if gh else 'no'} |")


if __name__ == "__main__":
    main(sys.argv[1])
