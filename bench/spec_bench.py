#!/usr/bin/env python3
"""bench/spec_bench.py: speculative decoding on against off, by task, through two running servers
that differ only in speculative.method (the same model, binary and device).

Tasks: three whose answers copy from the prompt (summarize, edit code, answer from a document) and
open-ended chat. Every request is a greedy chat completion of at most --max-tokens tokens that ends
at the model's end of turn, so a grounded task measures its answer and not what a model babbles past
it (--ignore-eos decodes --max-tokens always; greedy answers are the same length on both servers at
batch 1 either way). At each client count, each client sends --rounds
requests of the task back to back. Per (server, task, clients) one JSON line: output tok/s (tokens
/ wall time of the level), mean per-request decode speed, and for the speculating server the draft
tokens and accepted tokens the level added to its spec_decode_* counters. A summary line per (task,
clients) gives the speedup (on / off) and whether every answer was the same text on both, and at one
client the answer of the server without speculation (what the drafts had to guess).

  tessera serve --model M --set http.port=8001 &
  tessera serve --model M --set http.port=8002 --set speculative.method=ngram &
  python3 bench/spec_bench.py --off http://127.0.0.1:8001 --on http://127.0.0.1:8002 --model M
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import re
import time
from pathlib import Path

import httpx

from serve_load import commit, device, spread_clients

REPO = Path(__file__).resolve().parents[1]

ARTICLE = (
    "The city council met on Tuesday to discuss the new bicycle lanes on Main Street. The lanes, "
    "which opened in March, have reduced car traffic by twelve percent, according to a report from "
    "the transport office. Shop owners on Main Street said that their sales went up in the spring, "
    "while some drivers complained about longer trips. The council voted to keep the lanes and to "
    "add two more on Oak Avenue and River Road next year, paid for by the regional transport fund.")
CODE = (
    "def total_price(items, tax):\n"
    "    total = 0\n"
    "    for item in items:\n"
    "        total = total + item.price * item.quantity\n"
    "    total = total + total * tax\n"
    "    return round(total, 2)\n")
DOCUMENT = (
    "Warranty terms. The device is covered for two years from the date of purchase. The warranty "
    "covers defects in materials and workmanship. It does not cover damage from water, drops or "
    "unauthorised repairs. To make a claim, contact support with the serial number and the receipt. "
    "Repairs under warranty take up to ten working days. Batteries are covered for one year.")
TASKS = {
    "summarize": f"{ARTICLE}\n\nSummarize the article above in three sentences, reusing its wording.",
    "edit_code": f"{CODE}\nRename the function to compute_total and the variable total to amount. "
                 "Return the whole edited code.",
    "document_qa": f"{DOCUMENT}\n\nQuote the sentences of the text above that say what the warranty does "
                   "not cover and how to make a claim.",
    "open_chat": "Tell me a short story about a dragon who learns to bake bread.",
}


async def one(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int,
              ignore_eos: bool) -> tuple[str, int, float]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": ignore_eos}
    start = time.perf_counter()
    r = await client.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - start
    r.raise_for_status()
    answer = r.json()
    return answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"], elapsed


def spec_counters(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", timeout=10).text

    def total(name: str) -> float:
        return sum(float(m.group(1)) for m in re.finditer(rf"^\S*{name}\{{[^}}]*\}} (\S+)$", text, re.M))
    return total("spec_decode_num_draft_tokens_total"), total("spec_decode_num_accepted_tokens_total")


async def run_clients(url: str, args, task: str, level_clients: int, first: int, clients: int, barrier) -> dict:
    """Clients first .. first + clients - 1 of a level of `level_clients`, in this process, each
    sending --rounds requests back to back: their answers, tokens and decode speeds, and when the
    measured phase started and ended."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(args.timeout),
                                 limits=httpx.Limits(max_connections=clients + 4)) as client:
        out = {"texts": [], "per_request": [], "tokens": 0}

        async def worker(c: int):
            # Client c starts c / level_clients of --stagger-ms late: equal answers then end in
            # different steps, as requests that do not arrive together do.
            await asyncio.sleep(args.stagger_ms / 1000 * c / level_clients)
            for _ in range(args.rounds):
                text, n, seconds = await one(client, args.model, TASKS[task], args.max_tokens, args.ignore_eos)
                out["texts"].append(text)
                out["tokens"] += n
                out["per_request"].append(n / seconds)

        if barrier is not None:
            barrier.wait()
        out["start"] = time.time()
        await asyncio.gather(*(worker(c) for c in range(first, first + clients)))
        out["end"] = time.time()
    return out


async def warm_up(url: str, args, task: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(args.timeout)) as client:
        await one(client, args.model, TASKS[task], 8, True)


def clients_part(url: str, args, task: str, level_clients: int, first: int, clients: int, barrier) -> dict:
    return asyncio.run(run_clients(url, args, task, level_clients, first, clients, barrier))


def level(url: str, args, task: str, clients: int) -> tuple[dict, list[str]]:
    asyncio.run(warm_up(url, args, task))
    drafts0, accepted0 = spec_counters(url)
    parts = spread_clients(functools.partial(clients_part, url, args, task, clients), clients, args.processes)
    drafts1, accepted1 = spec_counters(url)
    texts = [t for part in parts for t in part["texts"]]
    per_request = [r for part in parts for r in part["per_request"]]
    tokens = sum(part["tokens"] for part in parts)
    wall = max(part["end"] for part in parts) - min(part["start"] for part in parts)
    line = {"bench": "spec_bench", "task": task, "clients": clients, "requests": len(texts),
            "tokens": tokens, "wall_s": round(wall, 3), "output_tok_per_s": round(tokens / wall, 2),
            "request_tok_per_s_mean": round(sum(per_request) / len(per_request), 2),
            "draft_tokens": drafts1 - drafts0, "accepted_tokens": accepted1 - accepted0,
            "acceptance": round((accepted1 - accepted0) / (drafts1 - drafts0), 3) if drafts1 > drafts0 else None,
            "client_processes": len(parts)}
    return line, texts


def agreement(off_texts: list[str], on_texts: list[str]) -> dict:
    """Every request of a level asks the same: same_text when both servers gave the same answers;
    matching, the share of speculating answers that the other server also gave; off_distinct, how
    many different answers the server without speculation gave (more than one: its own answer
    depends on the batch beside it); first_difference, where the first differing pair parts."""
    off_set = set(off_texts)
    result = {"same_text": sorted(off_texts) == sorted(on_texts),
              "matching": round(sum(t in off_set for t in on_texts) / len(on_texts), 3),
              "off_distinct": len(off_set)}
    differing = next((t for t in on_texts if t not in off_set), None)
    if differing is not None:
        other = off_texts[0]
        at = next((i for i, (a, b) in enumerate(zip(other, differing)) if a != b), min(len(other), len(differing)))
        result["first_difference"] = {"char": at, "off": other[max(0, at - 40):at + 40],
                                      "on": differing[max(0, at - 40):at + 40]}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--off", required=True, help="the server without speculation")
    ap.add_argument("--on", required=True, help="the same server with speculative.method set")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2,
                    help="levels run per server, in the order off, on, on, off, ...: the speedup is total "
                         "tokens over total time, so that drift over the run falls on both")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ignore-eos", action="store_true", help="decode --max-tokens tokens past the end of turn")
    ap.add_argument("--label", default="", help="what --on speculates with, for the result lines")
    ap.add_argument("--device", default="")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--stagger-ms", type=float, default=0.0,
                    help="spread the clients' first requests over this long (0: all at once, so that "
                         "equal answers keep the clients in step)")
    ap.add_argument("--processes", type=int, default=8,
                    help="client processes sharing a level's clients (one process is the bottleneck at 64)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "spec_bench.jsonl"))
    args = ap.parse_args()
    stamp = {"model": args.model, "ignore_eos": args.ignore_eos, "stagger_ms": args.stagger_ms,
             "device": args.device or device(), "commit": commit(),
             "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for task in args.tasks.split(","):
            for clients in (int(c) for c in args.clients.split(",")):
                runs = {"off": [], "on": []}
                for r in range(args.repeats):
                    for which in (("off", "on") if r % 2 == 0 else ("on", "off")):
                        runs[which].append(level(getattr(args, which), args, task, clients))
                lines = [line | {"speculation": "off", "repeat": i} for i, (line, _) in enumerate(runs["off"])]
                lines += [line | {"speculation": args.label or "on", "repeat": i} for i, (line, _) in enumerate(runs["on"])]
                off_rate, on_rate = (sum(l["tokens"] for l, _ in runs[w]) / sum(l["wall_s"] for l, _ in runs[w])
                                     for w in ("off", "on"))
                drafts = sum(l["draft_tokens"] for l, _ in runs["on"])
                accepted = sum(l["accepted_tokens"] for l, _ in runs["on"])
                lines.append({"bench": "spec_bench", "kind": "summary", "task": task, "clients": clients,
                              "speculation": args.label or "on", "speedup": round(on_rate / off_rate, 3),
                              "acceptance": round(accepted / drafts, 3) if drafts else None}
                             | agreement([t for _, ts in runs["off"] for t in ts], [t for _, ts in runs["on"] for t in ts])
                             | ({"off_answer": runs["off"][0][1][0]} if clients == 1 else {}))
                for line in lines:
                    text = json.dumps(line | stamp)
                    print(text, flush=True)
                    f.write(text + "\n")


if __name__ == "__main__":
    main()
