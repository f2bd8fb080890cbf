"""64 concurrent streaming clients (48 HTTP SSE through the openai SDK, 16 gRPC) all complete, and with
greedy decoding each one's text equals what the same prompt gives alone: continuous batching must
not change a token."""

from __future__ import annotations

import threading
import time

import grpc
import openai

import serving

CLIENTS = 64
MAX_TOKENS = 8
SUBJECTS = ["the sea", "a red fox", "winter", "the moon", "bread", "a lighthouse", "rain", "old maps",
            "a violin", "mountains", "coffee", "a small robot", "the desert", "trains", "a garden", "clocks"]
# 32 distinct prompts of different lengths (so prefill chunks and decodes mix in one step), each sent twice.
PROMPTS = [f"Write one sentence about {s}." for s in SUBJECTS] + \
          [f"Here is a short poem about {s}, in the style of an old sailor's song:" for s in SUBJECTS]


def stream_text(client, prompt):
    pieces, finish = [], None
    for chunk in client.completions.create(model=serving.LLM, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
    return "".join(pieces), finish


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
            # Each client is its own SDK instance with its own connection, as 64 users would be.
            own = openai.OpenAI(base_url=server.url + "/v1", api_key=serving.API_KEY, max_retries=0, timeout=300)
            go.wait()
            results[i] = stream_text(own, prompt)
        except BaseException as e:  # reported below, with the client's index
            results[i] = e

    peak = {"running": 0.0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                peak["running"] = max(peak["running"], server.metric("tessera:num_requests_running"))
            except Exception:  # a scrape may race the end of the test; the peak is what matters
                pass
            time.sleep(0.1)

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
    assert not mismatches, f"{len(mismatches)} batched outputs differ from single-client ones: {mismatches[:3]}"
    # The clients really were batched together, not served one after another.
    assert peak["running"] > 8, f"at most {peak['running']} requests ran at once in {elapsed:.1f}s"
    serving.wait_for(lambda: server.metric("tessera:kv_cache_usage_perc") == 0, 10, what="KV freed")
