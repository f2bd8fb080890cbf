#!/usr/bin/env python3
"""bench/document_reuse.py: time to first token of a RAG-shaped request (a shared prefix, eight
512-token documents, a question) against a running `tessera serve`, three ways, in one run:

  cold            new documents every time: only the shared prefix can come from a cache;
  prefix_only     documents seen before, in another order, numbered sequentially: a position-keyed
                  prefix cache (vLLM's automatic prefix caching) can reuse only the shared prefix,
                  which is what this case measures on Tessera itself;
  documents_warm  the same, with `positions: parallel`: every document's K/V is copied in.

Prints one JSON line per case (median and spread of the TTFT over --reps, cached tokens per
request) and a ratio line. Usage:
  bench/document_reuse.py --url http://127.0.0.1:8080 [--api-key K] [--reps 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import urllib.request

DOCS, DOC_TOKENS, PREFIX_TOKENS, QUESTION_TOKENS = 8, 512, 64, 32


def first_token_ms(url: str, headers: dict, model: str, prompt: list[int], attention: dict) -> tuple[float, int]:
    """Streams one completion of one token; returns (ms to the first text chunk, cached tokens)."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "tessera": {"attention": attention}}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **headers})
    t0 = time.perf_counter()
    first = None
    cached = 0
    with urllib.request.urlopen(request, timeout=600) as r:  # the standard library: the GPU host has no requests
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = (time.perf_counter() - t0) * 1000.0
            if chunk.get("usage"):
                cached = chunk["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return first, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--model", default="")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", default="", help="recorded in the output (cpu, cuda)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if not args.model:
        with urllib.request.urlopen(urllib.request.Request(args.url + "/v1/models", headers=headers), timeout=30) as r:
            args.model = json.load(r)["data"][0]["id"]
    model = args.model
    rng = random.Random(2026)
    ids = lambda n: [rng.randrange(1000, 40000) for _ in range(n)]  # noqa: E731
    prefix = ids(PREFIX_TOKENS)

    def prompt_of(docs, parallel):
        prompt = prefix + [t for d in docs for t in d] + ids(QUESTION_TOKENS)
        attention = {"segments": {"lengths": [len(d) for d in docs], "shared_prefix": PREFIX_TOKENS,
                                  "positions": "parallel" if parallel else "sequential"}}
        return prompt, attention

    first_token_ms(args.url, headers, model, *prompt_of([ids(DOC_TOKENS) for _ in range(DOCS)], True))  # warm-up
    results = {}
    for case in ("cold", "prefix_only", "documents_warm"):
        times, cached = [], []
        for _ in range(args.reps):
            docs = [ids(DOC_TOKENS) for _ in range(DOCS)]
            parallel = case != "prefix_only"
            if case != "cold":  # seen once before, in another order
                first_token_ms(args.url, headers, model, *prompt_of(docs, parallel))
                docs = docs[::-1]
                rng.shuffle(docs)
            ms, hit = first_token_ms(args.url, headers, model, *prompt_of(docs, parallel))
            times.append(ms)
            cached.append(hit)
        results[case] = statistics.median(times)
        line = {"bench": "document_reuse", "backend": args.backend, "case": case, "documents": DOCS,
                "document_tokens": DOC_TOKENS, "prefix_tokens": PREFIX_TOKENS, "question_tokens": QUESTION_TOKENS,
                "prompt_tokens": PREFIX_TOKENS + DOCS * DOC_TOKENS + QUESTION_TOKENS, "reps": args.reps,
                "ttft_ms_median": round(results[case], 2), "ttft_ms_min": round(min(times), 2),
                "ttft_ms_max": round(max(times), 2), "cached_tokens_median": statistics.median(cached)}
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(line) + "\n")
    ratio = {"bench": "document_reuse", "backend": args.backend,
             "warm_speedup_vs_cold": round(results["cold"] / results["documents_warm"], 2),
             "warm_speedup_vs_prefix_only": round(results["prefix_only"] / results["documents_warm"], 2)}
    print(json.dumps(ratio), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(ratio) + "\n")


if __name__ == "__main__":
    main()
