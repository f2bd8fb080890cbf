#!/usr/bin/env python3
"""bench/overload.py: far more concurrent streaming clients than the server admits (default 1,000),
half over HTTP SSE and half over gRPC, for --seconds; then every outcome is accounted for.

Each client loops: one streamed completion (greedy, ignore_eos, --max-tokens) at a time. An answer
is one of:
  full       every token and a finish reason ([DONE] over HTTP; the final message over gRPC);
  refused    HTTP 429 with a Retry-After header, or gRPC RESOURCE_EXHAUSTED with
             grpc-retry-pushback-ms; the client then waits as told and tries again;
  lost       anything else: another status, a stream cut short, a reset, a missing retry hint;
  hung       no answer within --timeout seconds.
After --seconds no new request starts, and the run waits for those in flight. The server's RSS and
thread count are sampled every second, and again after --settle seconds of idle, to show memory is
bounded while overloaded and comes back after.

Prints one JSON line per 10 s and a summary line, appended to --out. Exits 1 unless lost and hung
are 0 and some responses were full. (Past the queue, who gets in is first come: clients_without_full
counts those that were refused every time they asked.)

  python3 bench/overload.py --url http://127.0.0.1:8080 --grpc 127.0.0.1:50051 --pid $(pgrep -n tessera)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import grpc
import httpx

from serve_load import commit, device, percentile

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Write one sentence about the sea.", "Name three colours.", "Count to five:",
           "The capital of France is", "Tell me a joke about cats.", "Describe a small robot."]


def proc_status(pid: int) -> tuple[float, int]:
    """(RSS MiB, threads) of a process."""
    rss, threads = 0.0, 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def grpc_modules():
    """(pb2, pb2_grpc) compiled from proto/ with grpcio-tools into a temp dir."""
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    import serving  # noqa: PLC0415 (the tests' proto compiler)

    return serving.generate_grpc_modules(Path(tempfile.mkdtemp(prefix="tessera-pb-")))


class Tally:
    def __init__(self, clients: int):
        self.counts = {"full": 0, "refused": 0, "lost": 0, "hung": 0}
        self.by_protocol = {"http": {"full": 0, "refused": 0}, "grpc": {"full": 0, "refused": 0}}
        self.full_per_client = [0] * clients
        self.first_lost: list[str] = []
        self.seconds = {"http": {"full": [], "refused": []}, "grpc": {"full": [], "refused": []}}

    def add(self, client: int, protocol: str, outcome: str, seconds: float, detail: str = "") -> None:
        self.counts[outcome] += 1
        if outcome in ("full", "refused"):
            self.by_protocol[protocol][outcome] += 1
            self.seconds[protocol][outcome].append(seconds)
        if outcome == "full":
            self.full_per_client[client] += 1
        elif outcome in ("lost", "hung") and len(self.first_lost) < 5:
            self.first_lost.append(f"{protocol}: {outcome}: {detail}")


async def http_once(client: httpx.AsyncClient, args, prompt: str) -> tuple[str, float, str]:
    """(outcome, seconds to wait before the next request, detail)."""
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code == 429:
            await r.aread()
            retry_after = r.headers.get("retry-after")
            if retry_after is None:
                return "lost", 0.0, "429 without Retry-After"
            return "refused", float(retry_after), ""
        if r.status_code != 200:
            return "lost", 0.0, f"status {r.status_code}: {(await r.aread())[:200]!r}"
        finish, done = None, False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return "lost", 0.0, f"error event {event['error']}"
            for choice in event.get("choices", []):
                finish = choice.get("finish_reason") or finish
        if done and finish == "length":
            return "full", 0.0, ""
        return "lost", 0.0, f"stream ended: done={done} finish={finish}"


async def grpc_once(stub, pb2, args, prompt: str) -> tuple[str, float, str]:
    request = pb2.GenerateRequest(model=args.model, text=prompt, max_tokens=args.max_tokens,
                                  sampling=pb2.SamplingParams(temperature=0, ignore_eos=True))
    call = stub.Generate(request, metadata=args.metadata)
    finish = 0  # FINISH_REASON_UNSPECIFIED until the final chunk
    try:
        async for message in call:
            finish = message.finish_reason or finish
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            pushback = dict(e.trailing_metadata() or ()).get("grpc-retry-pushback-ms")
            if pushback is None:
                return "lost", 0.0, "RESOURCE_EXHAUSTED without grpc-retry-pushback-ms"
            return "refused", int(pushback) / 1000, ""
        return "lost", 0.0, f"{e.code().name}: {e.details()}"
    if finish != pb2.FINISH_REASON_LENGTH:
        return "lost", 0.0, f"stream ended with finish_reason {finish}"
    return "full", 0.0, ""


async def client_loop(i: int, args, tally: Tally, send) -> None:
    protocol = "grpc" if i % 2 else "http"
    rng = random.Random(i)
    await asyncio.sleep(rng.random() * args.ramp)  # clients arrive over --ramp seconds
    while time.time() < args.stop_at:
        sent_at = time.monotonic()
        try:
            outcome, wait_s, detail = await asyncio.wait_for(send(i, PROMPTS[rng.randrange(len(PROMPTS))]),
                                                             args.timeout)
        except asyncio.TimeoutError:
            outcome, wait_s, detail = "hung", 0.0, f"no answer in {args.timeout:.0f} s"
        except Exception as e:  # noqa: BLE001 (every failure is counted as lost, and the first shown)
            outcome, wait_s, detail = "lost", 0.0, repr(e)[:300]
        tally.add(i, protocol, outcome, time.monotonic() - sent_at, detail)
        if wait_s > 0:
            await asyncio.sleep(wait_s * (0.5 + rng.random()))  # jittered, so retries do not arrive in lockstep


async def run_side(protocol: str, part: int, args) -> Tally:
    """One part of one protocol's clients (HTTP: even indices, gRPC: odd), in this process's event loop."""
    tally = Tally(args.clients)
    clients = range((0 if protocol == "http" else 1) + 2 * part, args.clients, 2 * args.processes)
    if protocol == "http":
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        limits = httpx.Limits(max_connections=len(clients), max_keepalive_connections=len(clients))
        async with httpx.AsyncClient(base_url=args.url, headers=headers, limits=limits,
                                     timeout=httpx.Timeout(args.timeout)) as client:
            await asyncio.gather(*(client_loop(i, args, tally, lambda i, p: http_once(client, args, p))
                                   for i in clients))
        return tally
    pb2, pb2_grpc = grpc_modules()
    args.metadata = (("authorization", f"Bearer {args.api_key}"),) if args.api_key else ()
    channels = [grpc.aio.insecure_channel(args.grpc) for _ in range(args.grpc_channels)]
    stubs = [pb2_grpc.InferenceServiceStub(c) for c in channels]
    await asyncio.gather(*(client_loop(i, args, tally, lambda i, p: grpc_once(stubs[i // 2 % len(stubs)], pb2, args, p))
                           for i in clients))
    for c in channels:
        await c.close()
    return tally


def side_process(protocol: str, part: int, args) -> Tally:
    # A descriptor per connection: 500 clients need more than the usual soft limit of 1,024 with room.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return asyncio.run(run_side(protocol, part, args))


def run(args) -> dict:
    # Client processes per protocol: in one event loop, grpc.aio's calls waited behind 500 SSE
    # streams for ~40 s, and httpx's pool of 500 answered 429s 20 s late; that measured the client.
    args.grpc_channels = max(1, args.clients // 2 // args.processes // 50)  # gRPC clients share connections, 50 streams each
    rss0, threads0 = proc_status(args.pid)
    samples: list[tuple[float, int]] = []
    start = time.monotonic()
    args.stop_at = time.time() + args.seconds
    with ProcessPoolExecutor(2 * args.processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        sides = [pool.submit(side_process, p, k, args) for p in ("http", "grpc") for k in range(args.processes)]
        last_print = 0.0
        while not all(f.done() for f in sides):
            samples.append(proc_status(args.pid))
            t = time.monotonic() - start
            if t - last_print >= 10:
                last_print = t
                print(json.dumps({"t_s": round(t), "rss_mib": round(samples[-1][0], 1), "threads": samples[-1][1]}),
                      flush=True)
            time.sleep(1)
        results = [f.result() for f in sides]
    elapsed = time.monotonic() - start
    time.sleep(args.settle)
    rss_idle, threads_idle = proc_status(args.pid)
    tally = Tally(args.clients)
    for side in results:
        for k, v in side.counts.items():
            tally.counts[k] += v
        tally.first_lost += side.first_lost
        tally.full_per_client = [a + b for a, b in zip(tally.full_per_client, side.full_per_client)]
        for protocol in ("http", "grpc"):
            for outcome in ("full", "refused"):
                tally.by_protocol[protocol][outcome] += side.by_protocol[protocol][outcome]
                tally.seconds[protocol][outcome] += side.seconds[protocol][outcome]
    clients_without_full = sum(1 for n in tally.full_per_client if n == 0)
    return {
        "impl": "tessera-serve",
        "bench": "overload",
        "clients": args.clients,
        "http_clients": len(range(0, args.clients, 2)),
        "grpc_clients": len(range(1, args.clients, 2)),
        "grpc_channels": args.grpc_channels,
        "client_processes": 2 * args.processes,
        "seconds": args.seconds,
        "elapsed_s": round(elapsed, 1),
        "max_tokens": args.max_tokens,
        **tally.counts,
        "by_protocol": tally.by_protocol,
        # Seconds from sending to the answer: p50 / p99 / max, per protocol and outcome.
        "answer_s": {p: {o: [round(percentile(v, q), 2) for q in (50, 99, 100)] for o, v in d.items() if v}
                     for p, d in tally.seconds.items()},
        "full_per_s": round(tally.counts["full"] / elapsed, 1),
        "clients_without_full": clients_without_full,
        "first_lost": tally.first_lost,
        "rss_mib": {"before": round(rss0, 1), "max": round(max(s[0] for s in samples), 1),
                    f"idle_after_{args.settle:.0f}s": round(rss_idle, 1)},
        "threads": {"before": threads0, "max": max(s[1] for s in samples),
                    f"idle_after_{args.settle:.0f}s": threads_idle},
        "device": device(),
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="HTTP address, e.g. http://127.0.0.1:8080")
    ap.add_argument("--grpc", required=True, help="gRPC address, e.g. 127.0.0.1:50051")
    ap.add_argument("--pid", type=int, required=True, help="the tessera serve process (RSS, threads)")
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--ramp", type=float, default=2.0, help="clients start spread over this many seconds")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--processes", type=int, default=2, help="client processes per protocol")
    ap.add_argument("--timeout", type=float, default=120.0, help="a request unanswered this long is hung")
    ap.add_argument("--settle", type=float, default=15.0, help="idle seconds before the last RSS sample")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--api-key", default=os.environ.get("TESSERA_API_KEY", ""))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "overload_cpu.jsonl"))
    args = ap.parse_args()
    result = run(args)
    line = json.dumps(result)
    print(line, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(line + "\n")
    ok = result["lost"] == 0 and result["hung"] == 0 and result["full"] > 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
