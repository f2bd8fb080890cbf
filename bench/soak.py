#!/usr/bin/env python3
"""bench/soak.py: repeated requests against a running `tessera serve` for --minutes, sampling the
server's RSS (/proc/PID/status VmRSS) and, with --gpu, its GPU memory (nvidia-smi) every --interval
seconds, to show memory stays flat.

Clients loop over streamed and unstreamed completions, chat completions, embeddings and a
client-side cancel mid-stream (each path that allocates per request). RSS is first sampled after a
warm-up round, so model loading and first-use allocations are not counted as growth. Prints one
JSON line per sample, then a summary line (start / end / max RSS, requests, errors), which is also
appended to --out (bench/results/serve_soak_cpu.jsonl).

  python3 bench/soak.py --url http://127.0.0.1:8080 --pid $(pgrep -n tessera) --minutes 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import time
from pathlib import Path

import httpx

from serve_load import commit, device

REPO = Path(__file__).resolve().parents[1]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def gpu_mib(pid: int) -> float | None:
    """The GPU memory nvidia-smi reports for pid (MiB), or None when it lists no such process."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return float(fields[1])
    return None


def growth(values: list[float]) -> dict:
    """First (after warm-up), last and max of a series, and the growth from first to last in percent."""
    return {"start": round(values[0], 1), "end": round(values[-1], 1), "max": round(max(values), 1),
            "growth_pct": round(100.0 * (values[-1] - values[0]) / values[0], 3)}


async def request_once(client: httpx.AsyncClient, args, i: int) -> None:
    kind = i % 5
    if kind == 0:
        r = await client.post("/v1/completions", json={"model": args.model, "prompt": f"Count to {i % 7 + 2}:",
                                                       "max_tokens": args.max_tokens, "temperature": 0.7,
                                                       "seed": i})
        r.raise_for_status()
    elif kind == 1:
        r = await client.post("/v1/chat/completions", json={
            "model": args.model, "max_tokens": args.max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Say {i}."}]})
        r.raise_for_status()
    elif kind == 2 and args.embedding_model:
        r = await client.post("/v1/embeddings", json={"model": args.embedding_model,
                                                      "input": [f"sentence {i}", "another one", "x" * (i % 50 + 1)]})
        r.raise_for_status()
    elif kind == 3:
        # Client goes away after the first chunk: the server must cancel and free everything.
        async with client.stream("POST", "/v1/completions", json={
                "model": args.model, "prompt": "Tell a long story.", "max_tokens": 64, "stream": True}) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break
    else:
        async with client.stream("POST", "/v1/chat/completions", json={
                "model": args.model, "max_tokens": args.max_tokens, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"Describe the number {i}."}]}) as r:
            r.raise_for_status()
            async for _ in r.aiter_lines():
                pass


async def soak(args) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=httpx.Timeout(600.0)) as client:
        for i in range(5):  # warm-up: every request kind once
            await request_once(client, args, i)
        counts = {"requests": 0, "errors": 0}
        first_error: list[str] = []
        stop_at = time.monotonic() + args.minutes * 60

        async def worker(w: int):
            i = w
            while time.monotonic() < stop_at:
                try:
                    await request_once(client, args, i)
                    counts["requests"] += 1
                except Exception as e:  # counted and reported
                    counts["errors"] += 1
                    if not first_error:
                        first_error.append(repr(e))
                i += args.clients

        samples = []
        gpu_samples: list[float] = []

        async def sampler():
            start = time.monotonic()
            while True:
                rss = rss_kib(args.pid)
                samples.append(rss)
                gpu = gpu_mib(args.pid) if args.gpu else None
                if gpu is not None:
                    gpu_samples.append(gpu)
                print(json.dumps({"t_s": round(time.monotonic() - start, 1), "rss_mib": round(rss / 1024, 1),
                                  "gpu_mib": gpu, "requests": counts["requests"], "errors": counts["errors"]}),
                      flush=True)
                if time.monotonic() >= stop_at:
                    return
                await asyncio.sleep(min(args.interval, max(0.0, stop_at - time.monotonic())))

        await asyncio.gather(sampler(), *(worker(w) for w in range(args.clients)))
        samples.append(rss_kib(args.pid))
    mib = [s / 1024 for s in samples]
    return {
        "impl": "tessera-serve",
        "bench": "soak",
        "minutes": args.minutes,
        "clients": args.clients,
        "requests": counts["requests"],
        "errors": counts["errors"],
        "first_error": first_error[0] if first_error else None,
        "rss_start_mib": round(mib[0], 1),
        "rss_end_mib": round(mib[-1], 1),
        "rss_max_mib": round(max(mib), 1),
        "rss_min_mib": round(min(mib), 1),
        "samples": len(mib),
        "rss_mib": growth(mib),
        "gpu_mib": growth(gpu_samples) if gpu_samples else None,
        "device": device(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True, help="the tessera serve process")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between RSS samples")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--embedding-model", default="minilm", help="'' to skip embeddings")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--gpu", action="store_true", help="also sample the server's GPU memory (nvidia-smi)")
    ap.add_argument("--api-key", default=os.environ.get("TESSERA_API_KEY", ""))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "serve_soak_cpu.jsonl"))
    args = ap.parse_args()
    summary = json.dumps(asyncio.run(soak(args)))
    print(summary, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(summary + "\n")


if __name__ == "__main__":
    main()
