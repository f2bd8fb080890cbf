#!/usr/bin/env python3
"""bench/embed_summary.py: the GPU embeddings table from one run's JSON lines (tessera-embed-bench, embed_peers.py,
serve_load.py --endpoint embeddings): every case with Tessera (fp16, bf16) and the peers of the same run, the
ratio to HF transformers, and the must and goal bars (H100) checked where they apply.

  python3 bench/embed_summary.py OUT_DIR/embed.jsonl OUT_DIR/peers.jsonl [OUT_DIR/serve_embed.jsonl] > summary.md
"""
import json
import sys

# case -> (must, goal), the bars GPU embeddings are held to; "x HF" bars are ratios to the HF peer of the same run.
BARS = {
    "fixed": ("tessera >= HF", ">= 25,000 seq/s"),
    "latency": ("<= 2 ms", "<= 0.5 ms"),
    "mixed": (">= 1.5x HF padded", ">= 2x HF padded"),
}


def load(paths):
    lines = []
    for p in paths:
        try:
            with open(p) as f:
                for raw in f:
                    raw = raw.strip()
                    if raw.startswith("{"):
                        try:
                            lines.append(json.loads(raw))
                        except json.JSONDecodeError:
                            pass
        except OSError as e:
            print(f"<!-- {p}: {e} -->")
    return lines


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v:.3f} ms"
    if v >= 1e6:
        return f"{v / 1e6:.2f} M {unit}"
    return f"{v:,.0f} {unit}"


def verdict(case, tessera, hf):
    if tessera is None:
        return "no tessera line", "-"
    v = tessera["value"]
    if case == "fixed":
        must = "-" if hf is None else ("holds" if v >= hf["value"] else "MISSED")
        goal = f"{v / 25000:.2f}x of 25,000"
        return must, goal
    if case == "latency":
        return ("holds" if v <= 2.0 else "MISSED"), f"{v / 0.5:.2f}x of 0.5 ms"
    if case == "mixed":
        if hf is None:
            return "-", "-"
        r = v / hf["value"]
        return ("holds" if r >= 1.5 else "MISSED") + f" ({r:.2f}x)", f"{r / 2.0:.2f} of 2x"
    return "-", "-"


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    every = load(sys.argv[1:])
    lines = [l for l in every if "error" not in l]
    errors = [l for l in every if "error" in l]
    tessera = [l for l in lines if l.get("bench") == "tessera_embed"]
    peers = [l for l in lines if l.get("bench") == "embed_peers"]
    serve = [l for l in lines if l.get("bench") == "serve_load"]
    device = next((l.get("device") for l in tessera + peers), "?")
    commit = next((l.get("commit") for l in tessera + peers), "?")
    print(f"# Embeddings: {device}, commit {commit}\n")
    print("| case | shape | Tessera fp16 | Tessera bf16 | HF sdpa fp16 | sentence-transformers | "
          "Tessera fp16 / HF | must | goal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def pick(rows, **match):
        for r in rows:
            if all(r.get(k) == v for k, v in match.items()):
                return r
        return None

    default_budget = max((l.get("max_batch_tokens", 0) for l in tessera), default=0)
    for case, shape in (("fixed", "bert-base"), ("latency", "bert-base"), ("mixed", "bert-base")):
        t16 = pick(tessera, case=case, dtype="fp16", max_batch_tokens=default_budget,
                   model="bert-base (random weights)")
        t16 = t16 if t16 is not None else pick(tessera, case=case, dtype="fp16", model="bert-base (random weights)")
        tb = pick(tessera, case=case, dtype="bf16", model="bert-base (random weights)")
        hf = pick(peers, case=case, impl="hf-transformers-sdpa")
        unit = (t16 or hf or {}).get("unit", "")
        ratio = "-"
        if t16 and hf:
            ratio = f"{hf['value'] / t16['value']:.2f}x faster" if case == "latency" else f"{t16['value'] / hf['value']:.2f}x"
        must, goal = verdict(case, t16, hf)
        desc = {"fixed": "B128 x S128, seq/s", "latency": "1 x S128, median ms",
                "mixed": "128 texts 16-512, real tok/s"}[case]
        print(f"| {case} | {shape} {desc} | {fmt(t16 and t16['value'], unit)} | {fmt(tb and tb['value'], unit)} | "
              f"{fmt(hf and hf['value'], unit)} | - | {ratio} | {must} | {goal} |")
    for b in sorted({l.get("batch") for l in tessera + peers if l.get("case") == "sentences"}):
        t16 = pick(tessera, case="sentences", dtype="fp16", batch=b)
        tb = pick(tessera, case="sentences", dtype="bf16", batch=b)
        hf = pick(peers, case="sentences", impl="hf-transformers-sdpa", batch=b)
        st = pick(peers, case="sentences", impl="sentence-transformers", batch=b)
        ratio = f"{t16['value'] / hf['value']:.2f}x" if t16 and hf else "-"
        print(f"| sentences | MiniLM batch {b}, sentences/s | {fmt(t16 and t16['value'], '/s')} | "
              f"{fmt(tb and tb['value'], '/s')} | {fmt(hf and hf['value'], '/s')} | {fmt(st and st['value'], '/s')} | "
              f"{ratio} | - | - |")
    extra = [l for l in tessera if l.get("max_batch_tokens") != default_budget]
    if extra:
        print("\nTessera under a smaller packing budget (the server's limits.max_batch_tokens):\n")
        for l in extra:
            print(f"- {l['case']} {l['dtype']} budget {l['max_batch_tokens']} ({l.get('forwards', '?')} forwards): "
                  f"{fmt(l['value'], l['unit'])}")
    if serve:
        print("\n| /v1/embeddings | clients | inputs/request | req/s | inputs/s | p50 ms | p99 ms | errors |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for l in serve:
            print(f"| {l.get('model')} | {l.get('concurrency')} | {l.get('inputs_per_request')} | {l.get('req_per_s')} | "
                  f"{l.get('inputs_per_s')} | {l.get('e2e_p50_ms')} | {l.get('e2e_p99_ms')} | {l.get('errors')} |")
    if errors:
        print("\nErrors:\n")
        for l in errors:
            print(f"- {l.get('impl') or l.get('peer')} {l.get('case')}: {l['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
