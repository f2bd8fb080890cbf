#!/usr/bin/env python3
"""Sends traffic to a live Tessera, waits for Prometheus to scrape it, then runs every PromQL query of
the dashboard (check_dashboard.py --exprs) against the live Prometheus and fails unless each returns
data: at least one series, every value a finite number, and above zero for the panels the traffic
must move (rates, latencies, hit rate; not the queue or KV gauges, which are back to 0 by then). Grafana's variables become match-all
($job, $instance -> .+) and $__rate_interval becomes 1m.
  usage: compose_traffic_promql.py TESSERA_URL PROMETHEUS_URL EXPRS.json"""
import concurrent.futures
import json
import math
import sys
import time

import requests

MODEL = "smollm2-135m-instruct"
MUST_MOVE = {"Request rate", "Errors", "Time to first token", "Inter-token latency", "Prefix cache hit rate",
             "Token throughput", "End-to-end latency"}
# Long enough to fill several KV blocks, so that repeating it hits the prefix cache.
SHARED = ("You are a helpful assistant for a weather service. Answer in one short sentence, "
          "without lists, and name the city you are asked about. ") * 4


def completion(base, prompt, stream=False):
    r = requests.post(f"{base}/v1/completions", timeout=120, stream=stream,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": stream})
    if stream:
        return r.status_code, sum(1 for line in r.iter_lines() if line.startswith(b"data: "))
    return r.status_code, r.json()


def rejected(base, codes):
    """Two requests that fail on purpose (unknown model: 404, bad max_tokens: 400)."""
    for body in ({"model": "no-such-model", "prompt": "x"}, {"model": MODEL, "prompt": "x", "max_tokens": -1}):
        r = requests.post(f"{base}/v1/completions", json=body, timeout=30)
        codes[r.status_code] = codes.get(r.status_code, 0) + 1


def traffic(base):
    cities = ["Paris", "Lima", "Oslo", "Cairo", "Hanoi", "Quito", "Perth", "Accra"]
    codes = {}
    # Rejection series do not exist before the first rejection, and rate() sees no increase in a
    # series' first sample: reject once before the traffic and once after, so that the Errors panel
    # has a rate above zero.
    rejected(base, codes)
    time.sleep(6)  # a scrape in between
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(completion, base, f"{SHARED}What is the weather in {c}?", i % 2 == 1)
                for i, c in enumerate(cities * 2)]
        for f in futs:
            code, _ = f.result()
            codes[code] = codes.get(code, 0) + 1
    chat = requests.post(f"{base}/v1/chat/completions", timeout=120,
                         json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi!"}]})
    codes[chat.status_code] = codes.get(chat.status_code, 0) + 1
    rejected(base, codes)
    return codes


def main():
    base, prom, exprs_path = sys.argv[1:4]
    exprs = json.load(open(exprs_path))
    t0 = time.time()
    codes = traffic(base)
    print(f"promql: traffic: {sum(codes.values())} requests in {time.time() - t0:.1f}s, HTTP status counts {codes}")
    ok = sum(n for c, n in codes.items() if c == 200)
    if ok < 17 or codes.get(404) != 2 or codes.get(400) != 2:
        print("promql: FAIL: expected 17 successes, two 404 and two 400")
        return 1
    # Two scrapes (5 s apart) after the traffic, so that rate() over 1m sees it.
    time.sleep(12)
    failures = 0
    for e in exprs:
        q = e["expr"].replace("$__rate_interval", "1m").replace("$job", ".+").replace("$instance", ".+")
        r = requests.get(f"{prom}/api/v1/query", params={"query": q}, timeout=30).json()
        if r.get("status") != "success":
            print(f"promql: FAIL {e['panel']} {e['refId']}: {r.get('error')}")
            failures += 1
            continue
        series = r["data"]["result"]
        values = []
        for s in series:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items()))
            values.append((labels, float(s["value"][1])))
        finite = bool(values) and all(math.isfinite(v) for _, v in values)
        # Panels that the traffic must move (gauges like the queue are 0 again once it is over).
        if e["panel"] in MUST_MOVE and not any(v > 0 for _, v in values):
            finite = False
        shown = "; ".join(f"{{{l}}} {v:.4g}" for l, v in values) or "no series"
        print(f"promql: {'ok  ' if finite else 'FAIL'} {e['panel']:22s} {e['refId']}: {shown}")
        failures += 0 if finite else 1
    print(f"promql: {len(exprs) - failures}/{len(exprs)} dashboard queries returned data")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
