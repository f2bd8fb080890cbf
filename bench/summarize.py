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
        if not peers and copy is not None:
            frac = t["gbps"] / copy["gbps"]
            print(f"| {case} | {t['shape']} | {t['median_ms']:.4f} | {t['gbps']:.0f} GB/s | D2D copy | - | "
                  f"{copy['gbps']:.0f} GB/s | {frac:.0%} of copy |")
        for name, p in peers:
            print(f"| {case} | {t['shape']} | {t['median_ms']:.4f} | {t[rate_key]:.1f} {unit} | {name} | "
                  f"{p['median_ms']:.4f} | {p.get(rate_key, 0):.1f} {unit} | {p['median_ms'] / t['median_ms']:.2f}x |")
    if copy is not None:
        print(f"\nD2D copy (read + write): {copy['gbps']:.0f} GB/s, {copy['median_ms']:.3f} ms per GiB")


if __name__ == "__main__":
    main(sys.argv[1])
