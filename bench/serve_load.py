#!/usr/bin/env python3
"""bench/serve_load.py: requests/s and time to first token of a running `tessera serve` under 1, 8
and 64 concurrent streaming clients (OpenAI /v1/completions with SSE, async httpx); with
--endpoint embeddings, requests/s and latency of /v1/embeddings instead.

Each level runs `--rounds` requests per client back to back (every client starts its next request as
soon as the previous one ends), after one warm-up request per client. Definitions:
  TTFT      = from sending the request to the first SSE chunk that carries text
  req/s     = completed requests / wall time of the level
  output tok/s = completion tokens (from the usage chunk) / wall time of the level
One JSON line per level goes to stdout and is appended to --out (bench/results/serve_cpu.jsonl).

--endpoint embeddings: each request is POST /v1/embeddings with --inputs-per-request texts, taken in
turn from bench/data/embed_sentences.txt (real-ish English, about 23 MiniLM tokens each), and the
response must hold one embedding per input. Definitions:
  latency   = from sending the request to the whole JSON response read (p50, p90, p99)
  req/s     = completed requests / wall time of the level; inputs/s = req/s * inputs per request
  prompt tok/s = usage.prompt_tokens summed / wall time of the level

  tessera serve --config configs/server.yaml &
  python3 bench/serve_load.py --url http://127.0.0.1:8080 --model smollm2 [--api-key KEY]
  python3 bench/serve_load.py --url http://127.0.0.1:8080 --endpoint embeddings --model all-minilm-l6-v2 \
      --concurrency 64 --rounds 32
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Write one sentence about the sea.",
    "List three uses of a paperclip.",
    "Explain why the sky is blue in one line.",
    "Give a name for a small grey cat.",
    "What is the capital of Italy?",
    "Describe a lighthouse at night.",
    "Name a fruit that is yellow.",
    "Suggest a title for a story about trains.",
]


SENTENCES = REPO / "bench" / "data" / "embed_sentences.txt"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def device() -> str:
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


async def one_request(client: httpx.AsyncClient, args, prompt: str) -> tuple[float, float, int]:
    """(ttft_s, e2e_s, completion_tokens) of one streamed completion; raises on any failure."""
    # ignore_eos (vLLM's extension, which Tessera accepts): every request decodes exactly max_tokens, so
    # the work per request is fixed whatever the prompt.
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if args.schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "bench", "schema": args.schema}}
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter() - start
    return (ttft if ttft is not None else end), end, tokens


async def one_embedding(client: httpx.AsyncClient, args, texts: list[str]) -> tuple[float, float, int]:
    """(e2e_s, e2e_s, prompt_tokens) of one /v1/embeddings request; raises on any failure or a short answer."""
    body = {"model": args.model, "input": texts, "encoding_format": "float"}
    start = time.perf_counter()
    r = await client.post("/v1/embeddings", json=body)
    data = r.content
    end = time.perf_counter() - start
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {data[:300]!r}")
    answer = json.loads(data)
    if len(answer.get("data", [])) != len(texts) or not answer["data"][0].get("embedding"):
        raise RuntimeError(f"{len(answer.get('data', []))} embeddings for {len(texts)} inputs")
    return end, end, answer.get("usage", {}).get("prompt_tokens", 0)


def request_for(args):
    """send(client, i): the coroutine of request number i on the chosen endpoint (embeddings: request i takes
    the next --inputs-per-request sentences after request i - 1's)."""
    if args.endpoint == "embeddings":
        sentences = [l for l in Path(args.sentences).read_text().splitlines() if l]
        k = args.inputs_per_request

        def embed(client, i):
            at = (i * k) % len(sentences)
            return one_embedding(client, args, [sentences[(at + j) % len(sentences)] for j in range(k)])
        return embed
    return lambda client, i: one_request(client, args, PROMPTS[i % len(PROMPTS)])


async def run_clients(args, concurrency: int, first: int, clients: int, barrier=None) -> dict:
    """Clients first .. first + clients - 1 of a level of `concurrency`, in this process: their
    latencies, errors and tokens, and the wall-clock span of the measured phase."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # Idle connections expire on the client before the server's 5 s keep-alive timeout closes them:
    # httpx's default expiry is also 5 s, and reusing a connection the server is closing that very
    # moment fails the request (ReadError) through no fault of the serving path being measured.
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(args.timeout)) as client:
        # Warm-up: the engine has run these shapes once, and every client's keep-alive connection is
        # open. Connections open in waves of 4: the measured phase is about serving, not about the
        # HTTP listener's accept backlog under a connect storm (a failed warm-up is still reported).
        send = request_for(args)
        warmup = []
        for at in range(first, first + clients, 4):
            warmup += await asyncio.gather(*(send(client, i) for i in range(at, min(first + clients, at + 4))),
                                           return_exceptions=True)
        out = {"ttfts": [], "e2es": [], "errors": [], "tokens": 0,
               "warmup_errors": [repr(e) for e in warmup if isinstance(e, BaseException)]}

        async def worker(i: int):
            for r in range(args.rounds):
                try:
                    ttft, e2e, n = await send(client, i + r * concurrency if args.endpoint == "embeddings" else i + r)
                    out["ttfts"].append(ttft)
                    out["e2es"].append(e2e)
                    out["tokens"] += n
                except Exception as e:  # counted and reported in the result line, never dropped
                    out["errors"].append(repr(e))

        if barrier is not None:
            barrier.wait()  # every process has warmed up: the measured phase starts together
        out["start"] = time.time()
        await asyncio.gather(*(worker(i) for i in range(first, first + clients)))
        out["end"] = time.time()
    return out


def part_in_process(run_part, first: int, clients: int, barrier, results) -> None:
    results.put(run_part(first, clients, barrier))


def spread_clients(run_part, concurrency: int, processes: int) -> list:
    """run_part(first, clients, barrier) for every share of a level's `concurrency` clients, each in
    its own spawned process (so functools.partial of a module-level function), and their results.
    One Python process saturates its event loop near 300 small requests/s (measured against a GPU
    server answering in 5 ms): spreading the clients keeps the client from being what is timed.
    run_part waits on the barrier (None with one process) once its warm-up is done, so that the
    measured phases start together; its result says when that phase started and ended."""
    processes = max(1, min(processes, concurrency))
    if processes == 1:
        return [run_part(0, concurrency, None)]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    shares = [concurrency // processes + (1 if p < concurrency % processes else 0) for p in range(processes)]
    firsts = [sum(shares[:p]) for p in range(processes)]
    procs = [ctx.Process(target=part_in_process, args=(run_part, firsts[p], shares[p], barrier, results))
             for p in range(processes)]
    for proc in procs:
        proc.start()
    parts = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    return parts


def clients_part(args, concurrency: int, first: int, clients: int, barrier) -> dict:
    return asyncio.run(run_clients(args, concurrency, first, clients, barrier))


def run_level(args, concurrency: int) -> dict:
    parts = spread_clients(functools.partial(clients_part, args, concurrency), concurrency, args.processes)
    ttfts = [t for part in parts for t in part["ttfts"]]
    e2es = [t for part in parts for t in part["e2es"]]
    errors = [e for part in parts for e in part["errors"]]
    warmup_errors = [e for part in parts for e in part["warmup_errors"]]
    tokens = sum(part["tokens"] for part in parts)
    wall = max(part["end"] for part in parts) - min(part["start"] for part in parts)
    if args.endpoint == "embeddings":
        return {
            "impl": "tessera-serve",
            "bench": "serve_load",
            "endpoint": "/v1/embeddings",
            "model": args.model,
            "concurrency": concurrency,
            "inputs_per_request": args.inputs_per_request,
            "requests": len(e2es),
            "errors": len(errors),
            "first_error": errors[0] if errors else None,
            "warmup_errors": len(warmup_errors),
            "wall_s": round(wall, 3),
            "req_per_s": round(len(e2es) / wall, 3),
            "inputs_per_s": round(len(e2es) * args.inputs_per_request / wall, 2),
            "prompt_tok_per_s": round(tokens / wall, 2),
            "e2e_p50_ms": round(percentile(e2es, 50) * 1000, 2),
            "e2e_p90_ms": round(percentile(e2es, 90) * 1000, 2),
            "e2e_p99_ms": round(percentile(e2es, 99) * 1000, 2),
            "client_processes": max(1, min(args.processes, concurrency)),
            "device": args.device or device(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": os.environ.get("TESSERA_COMMIT") or commit(),
        }
    return {
        "impl": "tessera-serve",
        "bench": "serve_load",
        "endpoint": "/v1/completions (stream)",
        "model": args.model,
        "concurrency": concurrency,
        "requests": len(e2es),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "warmup_errors": len(warmup_errors),
        "max_tokens": args.max_tokens,
        "response_format": "json_schema" if args.schema else None,
        "wall_s": round(wall, 3),
        "req_per_s": round(len(e2es) / wall, 3),
        "output_tok_per_s": round(tokens / wall, 2),
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1000, 1),
        "ttft_p99_ms": round(percentile(ttfts, 99) * 1000, 1),
        "e2e_p50_ms": round(percentile(e2es, 50) * 1000, 1),
        "e2e_p99_ms": round(percentile(e2es, 99) * 1000, 1),
        "device": args.device or device(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the server's HTTP address, e.g. http://127.0.0.1:8080")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--api-key", default=os.environ.get("TESSERA_API_KEY", ""))
    ap.add_argument("--concurrency", default="1,8,64", help="comma-separated client counts")
    ap.add_argument("--rounds", type=int, default=4, help="requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json-schema", default="",
                    help="a JSON schema file: every completion is constrained to it (response_format json_schema); "
                         "pick one no output can complete within --max-tokens, so the work per request stays fixed")
    ap.add_argument("--endpoint", choices=("completions", "embeddings"), default="completions")
    ap.add_argument("--inputs-per-request", type=int, default=1, help="embeddings: texts per request")
    ap.add_argument("--sentences", default=str(SENTENCES), help="embeddings: one text a line")
    ap.add_argument("--device", default="", help="the device string of the result lines (default: this CPU)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--processes", type=int, default=1, help="client processes sharing each level's clients")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "serve_cpu.jsonl"))
    args = ap.parse_args()
    args.schema = json.loads(Path(args.json_schema).read_text()) if args.json_schema else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for level in (int(c) for c in args.concurrency.split(",")):
        line = json.dumps(run_level(args, level))
        print(line, flush=True)
        with out.open("a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
