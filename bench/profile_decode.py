#!/usr/bin/env python3
"""bench/profile_decode.py: batch-1 decode speed of `tessera serve --profile P`, for each profile given,
one after the other on this machine (so that the chosen profile's decode tok/s stands beside the bf16
profile's, in the same run).

For each profile: starts the server with only the profiled model (free ports, gRPC off), streams
--reps completions of --tokens tokens (greedy, ignore_eos, one at a time), and takes each one's decode
rate from its first to its last streamed token. One JSON line per profile (median, min, max) to stdout.
Standard library only (the GPU host has no requests package).

  python3 bench/profile_decode.py --tessera build/server/tessera --model smollm2-135m-instruct \\
      --profile bf16=tune-bf16/profile.yaml --profile chosen=tune-out/profile.yaml
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time
import urllib.request

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def stream_rate(port: int, model: str, tokens: int) -> tuple[float, int]:
    """Streams one completion; returns (decode tokens per second after the first token, tokens)."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    stamps = []
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:])["choices"][0]["text"]:
                    stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise RuntimeError(f"only {len(stamps)} tokens streamed")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)


def run_profile(args, label: str, path: str) -> dict:
    command = [args.tessera, "serve", "--model", args.model, "--profile", path, "--set", "http.port=0",
               "--set", "grpc.enabled=false"] + (["--force"] if args.force else [])
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    try:
        port = 0
        for line in proc.stdout:
            log.append(line)
            m = re.search(r"tessera: listening http=[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if not port:
            raise RuntimeError(f"{label}: the server did not start:\n{''.join(log[-20:])}")
        model = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read())["data"][0]["id"]
        stream_rate(port, model, 16)  # warm-up
        rates = [stream_rate(port, model, args.tokens)[0] for _ in range(args.reps)]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    choice = [l.strip() for l in log if "runs weight format" in l]
    return {"bench": "profile_decode", "profile": label, "path": path, "model": args.model, "tokens": args.tokens,
            "reps": args.reps, "decode_tok_s_median": round(statistics.median(rates), 1),
            "decode_tok_s_min": round(min(rates), 1), "decode_tok_s_max": round(max(rates), 1),
            "applied": choice[0] if choice else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tessera", default="build/server/tessera")
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", action="append", required=True, help="LABEL=path/to/profile.yaml (repeatable)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--force", action="store_true", help="pass --force to serve (a profile tuned elsewhere)")
    args = ap.parse_args()
    lines = [run_profile(args, *spec.split("=", 1)) for spec in args.profile]
    for line in lines:
        print(json.dumps(line), flush=True)
    base = lines[0]["decode_tok_s_median"]
    for line in lines[1:]:
        print(json.dumps({"bench": "profile_decode", "ratio": f"{line['profile']} / {lines[0]['profile']}",
                          "value": round(line["decode_tok_s_median"] / base, 3)}), flush=True)


if __name__ == "__main__":
    main()
