"""64 concurrent streaming clients (48 HTTP SSE through the openai SDK, 16 gRPC) all complete, and with
greedy decoding each one's text equals what the same prompt gives alone: continuous batching must
not change a token. On the CPU backend (fp32) that holds exactly. In bf16 on a GPU a batch of another
size runs other GEMM tiles and attention splits, so a token whose top-2 logprob margin in the solo run
is within the bf16 error may flip; a divergence is accepted only at such a token."""

from __future__ import annotations

import re
import threading
import time

import grpc
import openai
import requests

import serving

CLIENTS = 64
# A GPU finishes 8 tokens before the watcher below sees the batch: longer requests there (at 64 the
# H100 served all 64 streams in 2 s and the watcher saw at most 8 at once). Not much longer: over 256
# tokens bf16 drift between batched and solo runs outgrows BF16_MARGIN.
MAX_TOKENS = 8 if serving.BACKEND == "cpu" else 128
SUBJECTS = ["the sea", "a red fox", "winter", "the moon", "bread", "a lighthouse", "rain", "old maps",
            "a violin", "mountains", "coffee", "a small robot", "the desert", "trains", "a garden", "clocks"]
# 32 distinct prompts of different lengths (so prefill chunks and decodes mix in one step), each sent twice.
PROMPTS = [f"Write one sentence about {s}." for s in SUBJECTS] + \
          [f"Here is a short poem about {s}, in the style of an old sailor's song:" for s in SUBJECTS]


# The largest top-2 logprob margin a bf16 GPU run may flip (logit errors reach ~0.75 on SmolLM2;
# see tests/gpu/backend).
BF16_MARGIN = 1.0


def stream_text(client, prompt):
    pieces, finish = [], None
    for chunk in client.completions.create(model=serving.LLM, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
    return "".join(pieces), finish


RUNNING = re.compile(r"^tessera:num_requests_running(?:\{[^}]*\})? (\S+)$", re.M)


def running_now(server) -> float:
    """The running-requests gauge (summed over its series), read with one regex: the full Prometheus
    parser, competing for the GIL with 64 client threads, managed only a few scrapes during a GPU run
    of about two seconds."""
    return sum(float(v) for v in RUNNING.findall(requests.get(server.url + "/metrics", timeout=5).text))


def solo_margins(client, prompt):
    """Per generated token of the solo greedy run: (text, top-1 minus top-2 logprob)."""
    r = client.completions.create(model=serving.LLM, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    return [(tok, top[tok] - min(top.values()) if len(top) > 1 else float("inf"))
            for tok, top in zip(lp.tokens, lp.top_logprobs)]


def diverges_at_a_near_tie(batched: str, margins) -> bool:
    """True when `batched` follows the solo run up to a token whose solo margin is within bf16 error."""
    prefix = ""
    for tok, margin in margins:
        if not batched.startswith(prefix + tok):
            return margin <= BF16_MARGIN
        prefix += tok
    return False


def grpc_stream_text(server, pb, prompt):
    pb2, pb2_grpc = pb
    with grpc.insecure_channel(server.grpc_target) as channel:
        chunks = list(pb2_grpc.InferenceServiceStub(channel).Generate(
            pb2.GenerateRequest(model=serving.LLM, text=prompt, max_tokens=MAX_TOKENS,
                                sampling=pb2.SamplingParams(temperature=0)),
            metadata=server.grpc_metadata(), timeout=300))
    finish = {pb2.FINISH_REASON_STOP: "stop", pb2.FINISH_REASON_LENGTH: "length"}[chunks[-1].finish_reason]
    return "".join(c.text for c in chunks), finish


def test_64_concurrent_streams_match_single_client(idle, client, pb):
    server = idle
    alone = {p: stream_text(client, p) for p in PROMPTS}

    results: list[tuple[str, str] | BaseException | None] = [None] * CLIENTS
    go = threading.Barrier(CLIENTS, timeout=60)

    def run(i):
        try:
            prompt = PROMPTS[i % len(PROMPTS)]
            if i % 4 == 3:
                go.wait()
                results[i] = grpc_stream_text(server, pb, prompt)
                return
            # Each client is its own SDK instance with its own connection, as 64 users would be. Its
            # first call (SDK set-up, TCP connect) is made before the barrier: made after it, the 48
            # set-ups spread the arrivals over a second, longer than a 64-token stream on a GPU.
            own = openai.OpenAI(base_url=server.url + "/v1", api_key=serving.API_KEY, max_retries=0, timeout=300)
            own.models.list()
            go.wait()
            results[i] = stream_text(own, prompt)
        except BaseException as e:  # reported below, with the client's index
            results[i] = e

    peak = {"running": 0.0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                peak["running"] = max(peak["running"], running_now(server))
            except Exception:  # a scrape may race the end of the test; the peak is what matters
                pass
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    done.set()
    watcher.join()
    elapsed = time.monotonic() - started

    errors = [(i, r) for i, r in enumerate(results) if not isinstance(r, tuple)]
    assert not errors, f"{len(errors)} clients failed, e.g. #{errors[0][0]}: {errors[0][1]!r}"
    mismatches = [(i, PROMPTS[i % len(PROMPTS)], results[i][0], alone[PROMPTS[i % len(PROMPTS)]][0])
                  for i in range(CLIENTS) if results[i] != alone[PROMPTS[i % len(PROMPTS)]]]
    if serving.BACKEND != "cpu":
        near_ties = [m for m in mismatches if diverges_at_a_near_tie(m[2], solo_margins(client, m[1]))]
        print(f"{len(mismatches)} of {CLIENTS} batched outputs differ from the solo run, "
              f"{len(near_ties)} of them first at a near-tie token (bf16)")
        mismatches = [m for m in mismatches if m not in near_ties]
    assert not mismatches, f"{len(mismatches)} batched outputs differ from single-client ones: {mismatches[:3]}"
    # The clients really were batched together, not served one after another.
    assert peak["running"] > 8, f"at most {peak['running']} requests ran at once in {elapsed:.1f}s"
    serving.wait_for(lambda: server.metric("tessera:kv_cache_usage_perc") == 0, 10, what="KV freed")
