#!/usr/bin/env python3
"""bench/serve_scale.py: load generator for any OpenAI-compatible completions server (tessera serve,
llama.cpp's llama-server, ...): long unique prompts, an open-loop mixed workload and a stream storm.
Every request is a streamed /v1/completions with ignore_eos and temperature 0, so it decodes exactly
its max_tokens; every prompt starts with a per-run nonce and the request's own key, so no prefix cache
can serve any part of it. One JSON line per level goes to stdout and is appended to --out.

Modes:
  closed   for every (--prompt-tokens, --concurrency) level, each client sends one warm-up request and
           then --rounds requests back to back; a level still running after --level-timeout seconds is
           cancelled and reported with "finished": false and the counts so far.
  open     a fixed-seed list of requests, prompt and output lengths lognormal (means about
           --mean-prompt-tokens / --mean-output-tokens, tails past 2,000, capped by --max-prompt-tokens
           / --max-output-tokens), sent at Poisson arrival times at each of --rates req/s for
           --duration s (the same list and, per rate, the same arrival times for every server); requests
           still running --drain s after the last arrival are cancelled. Then a summary line: the
           highest rate at which >= 90% of requests met the objective, and the goodput there.
  streams  --streams requests started together (after one warm-up request), one each.

Prompt lengths are hit by calibration: before the levels, a prompt of --calibration-words random words
and one of none (max_tokens 1) give usage.prompt_tokens per word and the nonce's fixed cost.

Definitions (per level; latencies over the requests that completed):
  TTFT      = from sending the request to the first SSE chunk that carries text
  ITL       = gap between consecutive text-bearing chunks (percentiles over all gaps of all requests)
  TPOT      = per request, (e2e - TTFT) / (completion tokens - 1)
  e2e       = from sending the request to the end of the stream
  completion tokens = usage.completion_tokens of the stream's usage chunk; a server that sends none
              (usage_missing counts them) is counted by its text-bearing chunks
  completed = the stream ended ([DONE] or a finish_reason) with max_tokens completion tokens
  errors    = an explicit error: an HTTP status other than 200, or an error event in the stream
  lost      = neither completed nor an explicit error: a reset, a stream cut short or short of
              max_tokens, a client timeout, or still running when the level was cancelled (cancelled)
  output tok/s = completion tokens received by every request / wall time of the measured phase
  req/s     = completed requests / wall time
  goodput   = (open) completed requests with TTFT <= --slo-ttft-ms and TPOT <= --slo-tpot-ms / wall time;
              slo_met_fraction = those / requests sent at that rate
  client_cpu_max = the busiest client process's CPU time / wall: near 1.0, the client limits the
              numbers, so raise --processes

  tessera serve --model smollm2 &
  python3 bench/serve_scale.py --url http://127.0.0.1:8080 --model smollm2 --label tessera --processes 8
  python3 bench/serve_scale.py --mode open --url http://127.0.0.1:8080 --model smollm2 --rates 1,2,4,8,16
  # llama-server: slots (-np) >= the concurrency, and context per slot (-c / -np) >= prompt + max_tokens
  llama-server -m model.gguf --port 8081 -np 64 -c $((64 * 4224)) &
  python3 bench/serve_scale.py --mode streams --url http://127.0.0.1:8081 --label llama-server --streams 256
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import multiprocessing
import os
import queue
import random
import re
import resource
import secrets
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import commit, device, percentile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORDS = REPO / "bench" / "data" / "embed_sentences.txt"
WARMUP_WAVE = 8      # closed mode: clients' warm-up requests (and so their connections) open 8 at a time
LOGNORMAL_SIGMA = 1.2  # open mode: with mean 200, median ~97, p99 ~1,600, about 0.6% past 2,000
_VOCABULARY: list[str] = []


def vocabulary() -> list[str]:
    """The distinct lowercase words of bench/data/embed_sentences.txt (about 240 common English words)."""
    if not _VOCABULARY:
        _VOCABULARY.extend(sorted(set(re.findall(r"[a-z]+", WORDS.read_text().lower()))))
    return _VOCABULARY


def make_prompt(args, key: str, words: int) -> str:
    """This run's nonce and the request's key, then `words` random words drawn by (--seed, key): unique
    from its first token, and the same filler for the same key in every run."""
    rng = random.Random(f"{args.seed}/{key}")
    vocab = vocabulary()
    return f"{args.run_nonce}-{key}: " + " ".join(rng.choice(vocab) for _ in range(words))


def words_for(args, tokens: int) -> int:
    return max(0, round((tokens - args.prompt_overhead) / args.tokens_per_word))


def http_client(args, limits: httpx.Limits) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.AsyncClient(base_url=args.url, headers=headers, limits=limits, timeout=httpx.Timeout(args.timeout))


def calibrate(args) -> None:
    """args.tokens_per_word and args.prompt_overhead (the nonce, key and BOS) from two prompts' usage."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=httpx.Timeout(args.timeout)) as client:
        def prompt_tokens(words: int) -> int:
            # Keys of the measured requests' shape (L0.0c0r0, R0q0), so the overhead is theirs to within a token.
            body = {"model": args.model, "prompt": make_prompt(args, f"C0.0c0r{words}", words), "max_tokens": 1,
                    "temperature": 0}
            try:
                r = client.post("/v1/completions", json=body)
            except httpx.HTTPError as e:
                raise SystemExit(f"calibration: {e!r}") from e
            if r.status_code != 200:
                raise SystemExit(f"calibration: HTTP {r.status_code}: {r.text[:300]}")
            usage = r.json().get("usage") or {}
            if not usage.get("prompt_tokens"):
                raise SystemExit(f"calibration: no usage.prompt_tokens in {r.text[:300]}")
            return usage["prompt_tokens"]

        overhead = prompt_tokens(0)
        full = prompt_tokens(args.calibration_words)
    args.prompt_overhead = overhead
    args.tokens_per_word = max(0.1, (full - overhead) / args.calibration_words)


def new_record(max_tokens: int) -> dict:
    return {"outcome": "lost", "detail": None, "max_tokens": max_tokens, "ttft": None, "e2e": None, "itls": [],
            "tokens": 0, "prompt_tokens": None, "usage": False}


async def stream_request(client: httpx.AsyncClient, args, prompt: str, rec: dict) -> None:
    """One streamed completion, filled into rec as it goes (so a cancelled request keeps what it got).
    Never raises but CancelledError: every failure ends as rec["outcome"] "error" or "lost"."""
    body = {"model": args.model, "prompt": prompt, "max_tokens": rec["max_tokens"], "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    start = time.perf_counter()
    last = None
    chunks = 0
    done = finish = False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                rec["outcome"], rec["detail"] = "error", f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments (llama-server's ":" pings)
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                if chunk.get("error"):  # headers were out: the error travels as an event
                    rec["outcome"], rec["detail"] = "error", f"error event: {json.dumps(chunk['error'])[:300]}"
                    return
                choices = chunk.get("choices") or []
                if any(c.get("text") for c in choices):
                    if last is None:
                        rec["ttft"] = now - start
                    else:
                        rec["itls"].append(now - last)
                    last = now
                    chunks += 1
                    if not rec["usage"]:
                        rec["tokens"] = chunks
                finish = finish or any(c.get("finish_reason") for c in choices)
                usage = chunk.get("usage")
                if usage:  # Tessera: a last chunk with empty choices; llama-server: on the finish_reason chunk
                    rec["usage"] = True
                    rec["tokens"] = usage.get("completion_tokens", rec["tokens"])
                    rec["prompt_tokens"] = usage.get("prompt_tokens")
    except Exception as e:  # noqa: BLE001 (a transport or parse failure is a lost request, never dropped)
        rec["detail"] = repr(e)[:300]
        return
    finally:
        rec["e2e"] = time.perf_counter() - start
    if (done or finish) and rec["tokens"] >= rec["max_tokens"] and rec["ttft"] is not None:
        rec["outcome"] = "completed"
    else:
        rec["detail"] = (f"stream ended with {rec['tokens']} of {rec['max_tokens']} tokens "
                         f"([DONE]: {done}, finish_reason: {finish})")


async def tracked(client, args, prompt: str, rec: dict, records: list) -> None:
    records.append(rec)
    try:
        await stream_request(client, args, prompt, rec)
    except asyncio.CancelledError:
        rec["outcome"], rec["detail"] = "cancelled", "still running when the level was cancelled"
        raise


async def finish_by(tasks: list, deadline: float) -> bool:
    """Wait for tasks until time.monotonic() reaches deadline, then cancel the rest; True if none was left."""
    if not tasks:
        return True
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return not pending


def harness_errors(tasks: list) -> list[str]:
    return [repr(t.exception()) for t in tasks if t.done() and not t.cancelled() and t.exception()]


def wait_barrier(barrier, args) -> None:
    if barrier is not None:
        try:
            barrier.wait(timeout=args.level_timeout)
        except Exception:  # noqa: BLE001 (a process that died before the barrier: the rest still run and report)
            pass


# -- closed and streams: clients in this process ---------------------------------------------------------------

async def closed_clients(args, job: dict, barrier) -> dict:
    """Clients job["first"] .. + job["clients"] - 1 of a closed level: warm-up, then job["rounds"] requests each."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a descriptor per stream
    clients = range(job["first"], job["first"] + job["clients"])
    words = words_for(args, job["prompt_tokens"])
    limits = httpx.Limits(max_connections=job["clients"] + 4, max_keepalive_connections=job["clients"] + 4,
                          keepalive_expiry=2.0)  # see serve_load.py: expire before the server's 5 s keep-alive
    async with http_client(args, limits) as client:
        warm: list[dict] = []
        warm_clients = clients if job["warmup"] == "client" else (clients[:1] if job["first"] == 0 else [])

        async def warm_up():
            for at in range(0, len(warm_clients), WARMUP_WAVE):
                await asyncio.gather(*(tracked(client, args, make_prompt(args, f"{job['key']}w{c}", words),
                                               new_record(job["max_tokens"]), warm)
                                       for c in warm_clients[at:at + WARMUP_WAVE]))
        try:
            await asyncio.wait_for(warm_up(), args.level_timeout)
        except asyncio.TimeoutError:
            pass  # the unfinished warm-ups are "cancelled" in warm and reported as warm-up errors

        records: list[dict] = []

        async def worker(c: int):
            for r in range(job["rounds"]):
                await tracked(client, args, make_prompt(args, f"{job['key']}c{c}r{r}", words),
                              new_record(job["max_tokens"]), records)

        wait_barrier(barrier, args)  # every process has warmed up: the measured phase starts together
        start, cpu0 = time.time(), time.process_time()
        tasks = [asyncio.create_task(worker(c)) for c in clients]
        finished = await finish_by(tasks, time.monotonic() + args.level_timeout)
        end = time.time()
        cpu = time.process_time() - cpu0
    return {"records": records, "start": start, "end": end, "cpu_s": cpu, "finished": finished,
            "warmup_errors": [r["detail"] for r in warm if r["outcome"] != "completed"],
            "harness_errors": harness_errors(tasks)}


# -- open: arrivals in this process ----------------------------------------------------------------------------

async def open_arrivals(args, job: dict, barrier) -> dict:
    """This process's share of one rate's arrivals: job["arrivals"] = [(offset s, request index)]."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512, keepalive_expiry=2.0)
    async with http_client(args, limits) as client:
        warm: list[dict] = []
        try:  # one short request: the connection is open and the engine has run once
            await asyncio.wait_for(tracked(client, args, make_prompt(args, f"{job['key']}w{job['part']}", 32),
                                           new_record(8), warm), args.level_timeout)
        except asyncio.TimeoutError:
            pass
        records: list[dict] = []
        tasks = []
        lag = 0.0
        wait_barrier(barrier, args)
        start, cpu0, t0 = time.time(), time.process_time(), time.perf_counter()
        for offset, i in job["arrivals"]:
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(lag, time.perf_counter() - t0 - offset)
            prompt_tokens, output_tokens = args.workload[i % len(args.workload)]
            rec = new_record(output_tokens)
            tasks.append(asyncio.create_task(tracked(
                client, args, make_prompt(args, f"{job['key']}q{i}", words_for(args, prompt_tokens)), rec, records)))
        # The drain counts from the rate's last arrival, the same instant in every process.
        deadline = time.monotonic() + max(0.0, t0 + job["last_offset"] - time.perf_counter()) + args.drain
        finished = await finish_by(tasks, deadline)
        end = time.time()
        cpu = time.process_time() - cpu0
    return {"records": records, "start": start, "end": end, "cpu_s": cpu, "finished": finished, "send_lag_s": lag,
            "warmup_errors": [r["detail"] for r in warm if r["outcome"] != "completed"],
            "harness_errors": harness_errors(tasks)}


# -- processes -------------------------------------------------------------------------------------------------

def _process_main(func, args, job, barrier, results) -> None:
    try:
        results.put(asyncio.run(func(args, job, barrier)))
    except Exception as e:  # noqa: BLE001 (reported in the level's line)
        results.put({"crash": repr(e)})


def spread(func, args, jobs: list[dict]) -> tuple[list[dict], list[str]]:
    """func(args, job, barrier) for every job: in this process for one job, else one spawned process each
    (one Python event loop saturates near a few hundred streamed requests/s). (parts, failures)."""
    if len(jobs) == 1:
        return [asyncio.run(func(args, jobs[0], None))], []
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [ctx.Process(target=_process_main, args=(func, args, job, barrier, results)) for job in jobs]
    for p in procs:
        p.start()
    got: list[dict] = []
    while len(got) < len(procs):
        try:
            got.append(results.get(timeout=1.0))
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                try:
                    while True:
                        got.append(results.get(timeout=1.0))
                except queue.Empty:
                    break
    for p in procs:
        p.join(timeout=10)
    failures = [g["crash"] for g in got if "crash" in g]
    failures += ["a client process exited without a result"] * (len(procs) - len(got))
    return [g for g in got if "crash" not in g], failures


def shares(total: int, parts: int) -> list[tuple[int, int]]:
    """(first, count) of each of `parts` near-equal slices of range(total)."""
    sizes = [total // parts + (1 if p < total % parts else 0) for p in range(parts)]
    return [(sum(sizes[:p]), sizes[p]) for p in range(parts)]


# -- reporting -------------------------------------------------------------------------------------------------

def ms(values: list[float], q: float):
    return round(percentile(values, q) * 1000, 2) if values else None


def tpot(rec: dict) -> float:
    return (rec["e2e"] - rec["ttft"]) / (rec["tokens"] - 1) if rec["tokens"] > 1 else 0.0


def level_stats(parts: list[dict], failures: list[str]) -> dict:
    """Counts, throughput and latency percentiles of a level from its processes' parts."""
    records = [r for part in parts for r in part["records"]]
    done = [r for r in records if r["outcome"] == "completed"]
    errors = [r["detail"] for r in records if r["outcome"] == "error"]
    lost = [r for r in records if r["outcome"] in ("lost", "cancelled")]
    harness = failures + [e for part in parts for e in part["harness_errors"]]
    warmup = [e for part in parts for e in part["warmup_errors"]]
    wall = (max(p["end"] for p in parts) - min(p["start"] for p in parts)) if parts else 0.0
    ttfts, e2es = [r["ttft"] for r in done], [r["e2e"] for r in done]
    itls = [g for r in done for g in r["itls"]]
    tpots = [tpot(r) for r in done if r["tokens"] > 1]
    prompts = [r["prompt_tokens"] for r in records if r["prompt_tokens"]]
    tokens = sum(r["tokens"] for r in records)
    return {
        "finished": bool(parts) and all(p["finished"] for p in parts) and not failures,
        "requests": len(records),
        "completed": len(done),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "lost": len(lost),
        "cancelled": sum(r["outcome"] == "cancelled" for r in records),
        "first_lost": next((r["detail"] for r in lost if r["outcome"] == "lost"), lost[0]["detail"] if lost else None),
        "warmup_errors": len(warmup),
        "first_warmup_error": warmup[0] if warmup else None,
        "client_failures": len(harness),
        "first_client_failure": harness[0] if harness else None,
        "usage_missing": sum(not r["usage"] for r in done),
        "prompt_tokens_mean": round(statistics.fmean(prompts), 1) if prompts else None,
        "wall_s": round(wall, 3) if parts else None,
        "output_tok_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "req_per_s": round(len(done) / wall, 3) if wall > 0 else None,
        "ttft_p50_ms": ms(ttfts, 50), "ttft_p90_ms": ms(ttfts, 90), "ttft_p99_ms": ms(ttfts, 99),
        "itl_p50_ms": ms(itls, 50), "itl_p99_ms": ms(itls, 99),
        "tpot_p50_ms": ms(tpots, 50), "tpot_p99_ms": ms(tpots, 99),
        "e2e_p50_ms": ms(e2es, 50), "e2e_p99_ms": ms(e2es, 99),
        "client_cpu_max": round(max(p["cpu_s"] / wall for p in parts), 3) if parts and wall > 0 else None,
    }


def line(args, kind: str, **fields) -> dict:
    return {"impl": args.label, "bench": "serve_scale", "mode": args.mode, "kind": kind,
            "endpoint": "/v1/completions (stream)", "model": args.model, **fields,
            "tokens_per_word": round(args.tokens_per_word, 4), "prompt_overhead_tokens": args.prompt_overhead,
            "device": args.device or device(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": os.environ.get("TESSERA_COMMIT") or commit()}


def emit(args, record: dict) -> None:
    text = json.dumps(record)
    print(text, flush=True)
    with Path(args.out).open("a") as f:
        f.write(text + "\n")


# -- modes -----------------------------------------------------------------------------------------------------

def run_closed(args, key: str, prompt_tokens: int, concurrency: int, rounds: int, warmup: str) -> dict:
    processes = max(1, min(args.processes, concurrency))
    jobs = [{"key": key, "first": first, "clients": n, "rounds": rounds, "prompt_tokens": prompt_tokens,
             "max_tokens": args.max_tokens, "warmup": warmup} for first, n in shares(concurrency, processes)]
    parts, failures = spread(closed_clients, args, jobs)
    return {"client_processes": processes, **level_stats(parts, failures)}


def mode_closed(args) -> None:
    for p, prompt_tokens in enumerate(args.prompt_token_levels):
        for c, concurrency in enumerate(int(x) for x in args.concurrency.split(",")):
            stats = run_closed(args, f"L{p}.{c}", prompt_tokens, concurrency, args.rounds, "client")
            emit(args, line(args, "level", prompt_tokens_target=prompt_tokens, concurrency=concurrency,
                            rounds=args.rounds, max_tokens=args.max_tokens, level_timeout_s=args.level_timeout,
                            **stats))


def mode_streams(args) -> None:
    for p, prompt_tokens in enumerate(args.prompt_token_levels):
        for s, streams in enumerate(int(x) for x in args.streams.split(",")):
            stats = run_closed(args, f"S{p}.{s}", prompt_tokens, streams, 1, "one")
            emit(args, line(args, "level", prompt_tokens_target=prompt_tokens, streams=streams,
                            max_tokens=args.max_tokens, level_timeout_s=args.level_timeout, **stats))


def lognormal_int(rng: random.Random, mean: float, cap: int, floor: int) -> int:
    mu = math.log(mean) - LOGNORMAL_SIGMA ** 2 / 2  # so that the uncapped mean is `mean`
    return max(floor, min(cap, round(rng.lognormvariate(mu, LOGNORMAL_SIGMA))))


def dist(values: list[int]) -> dict:
    return {"mean": round(statistics.fmean(values), 1), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values)}


def mode_open(args) -> None:
    rates = [float(x) for x in args.rates.split(",")]
    rng = random.Random(args.seed)
    count = math.ceil(max(rates) * args.duration * 1.25) + 32  # enough for the highest rate's arrivals
    args.workload = [(lognormal_int(rng, args.mean_prompt_tokens, args.max_prompt_tokens, args.prompt_overhead + 1),
                      lognormal_int(rng, args.mean_output_tokens, args.max_output_tokens, 1)) for _ in range(count)]
    emit(args, line(args, "workload", seed=args.seed, requests_in_list=count,
                    prompt_tokens=dist([p for p, _ in args.workload]),
                    output_tokens=dist([o for _, o in args.workload]),
                    max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens))
    results = []
    for k, rate in enumerate(rates):
        arrivals_rng = random.Random(f"{args.seed}/arrivals/{rate}")
        offsets, t = [], arrivals_rng.expovariate(rate)
        while t < args.duration:
            offsets.append(t)
            t += arrivals_rng.expovariate(rate)
        processes = max(1, args.processes)
        jobs = [{"key": f"R{k}", "part": p, "last_offset": offsets[-1] if offsets else 0.0,
                 "arrivals": [(o, i) for i, o in enumerate(offsets) if i % processes == p]} for p in range(processes)]
        parts, failures = spread(open_arrivals, args, jobs)
        stats = level_stats(parts, failures)
        records = [r for part in parts for r in part["records"]]
        slo_ttft, slo_tpot = args.slo_ttft_ms / 1000, args.slo_tpot_ms / 1000
        good = sum(r["outcome"] == "completed" and r["ttft"] <= slo_ttft and tpot(r) <= slo_tpot for r in records)
        wall = stats["wall_s"] or 0.0
        sent = len(records)
        result = line(args, "level", rate=rate, duration_s=args.duration, drain_s=args.drain, sent=sent,
                      arrived_rate=round(sent / args.duration, 3),
                      max_send_lag_ms=round(max((p["send_lag_s"] for p in parts), default=0.0) * 1000, 1),
                      output_tokens_sent=sum(r["max_tokens"] for r in records),
                      goodput_req_per_s=round(good / wall, 3) if wall > 0 else None,
                      slo_met=good, slo_met_fraction=round(good / sent, 4) if sent else None,
                      slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, client_processes=processes, **stats)
        emit(args, result)
        results.append(result)
    passing = [r for r in results if r["slo_met_fraction"] is not None and r["slo_met_fraction"] >= 0.9]
    best = max(passing, key=lambda r: r["rate"]) if passing else None
    emit(args, line(args, "summary", rates=rates, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                    max_rate_90pct_slo=best["rate"] if best else None,
                    goodput_req_per_s=best["goodput_req_per_s"] if best else None,
                    slo_met_fraction=best["slo_met_fraction"] if best else None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("closed", "open", "streams"), default="closed")
    ap.add_argument("--url", required=True, help="the server's HTTP address, e.g. http://127.0.0.1:8080")
    ap.add_argument("--model", default="smollm2", help="the request's model field")
    ap.add_argument("--api-key", default=os.environ.get("TESSERA_API_KEY", ""))
    ap.add_argument("--label", default="tessera", help="the result lines' impl, e.g. tessera or llama-server")
    ap.add_argument("--device", default="", help="the device string of the result lines (default: this CPU)")
    ap.add_argument("--processes", type=int, default=1, help="client processes sharing each level's requests")
    ap.add_argument("--timeout", type=float, default=600.0, help="httpx timeout (connect, and each read) in s")
    ap.add_argument("--seed", type=int, default=0, help="prompt words, the open workload and its arrival times")
    ap.add_argument("--calibration-words", type=int, default=1000)
    ap.add_argument("--prompt-tokens", default=None,
                    help="comma-separated prompt lengths (closed: default 100,1000,4000; streams: default 200)")
    ap.add_argument("--max-tokens", type=int, default=128, help="closed and streams: completion tokens per request")
    ap.add_argument("--concurrency", default="1,8,64", help="closed: comma-separated client counts")
    ap.add_argument("--rounds", type=int, default=4, help="closed: measured requests per client per level")
    ap.add_argument("--level-timeout", type=float, default=600.0,
                    help="closed and streams: cancel a level's measured phase (and bound its warm-up) "
                         "after this many s")
    ap.add_argument("--streams", default="256", help="streams: comma-separated stream counts")
    ap.add_argument("--rates", default="1,2,4,8,16", help="open: comma-separated arrival rates, req/s")
    ap.add_argument("--duration", type=float, default=60.0, help="open: seconds of arrivals per rate")
    ap.add_argument("--drain", type=float, default=60.0,
                    help="open: requests still running this many s after the last arrival are cancelled")
    ap.add_argument("--mean-prompt-tokens", type=float, default=200.0)
    ap.add_argument("--mean-output-tokens", type=float, default=200.0)
    ap.add_argument("--max-prompt-tokens", type=int, default=3000)
    ap.add_argument("--max-output-tokens", type=int, default=2000)
    ap.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=50.0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "serve_scale.jsonl"))
    args = ap.parse_args()
    default_prompts = "200" if args.mode == "streams" else "100,1000,4000"
    args.prompt_token_levels = [int(x) for x in (args.prompt_tokens or default_prompts).split(",")]
    args.run_nonce = secrets.token_hex(4)  # this run's prompts share no prefix with an earlier run's
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    calibrate(args)
    {"closed": mode_closed, "open": mode_open, "streams": mode_streams}[args.mode](args)


if __name__ == "__main__":
    main()
