"""Prefix caching and per-document KV reuse through the OpenAI SDK: a prompt sharing a long prefix
with an earlier one reports its reused tokens in usage.prompt_tokens_details.cached_tokens and the
tessera:prefix_cache_* counters, and answers as it did cold; documents sent again in another order
(tessera.attention.segments with parallel positions) are reused and answer as a cold server does."""

from __future__ import annotations

import random

import openai

import serving

BLOCK = 16  # tokens per KV block (the server's default)


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


def complete(client, prompt, **extra):
    return client.completions.create(model=serving.LLM, prompt=prompt, max_tokens=8, temperature=0,
                                     logprobs=1, extra_body=extra or None)


def test_a_shared_prefix_is_reused_and_counted(server, client, idle):
    rng = random.Random(5)
    prefix = random_ids(rng, 400)
    first, second = prefix + random_ids(rng, 7), prefix + random_ids(rng, 9)
    queries = server.metric("tessera:prefix_cache_queries_total")
    hits = server.metric("tessera:prefix_cache_hits_total")

    a = complete(client, first)
    b = complete(client, second)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens == (400 // BLOCK) * BLOCK
    assert server.metric("tessera:prefix_cache_queries_total") - queries == len(first) + len(second)
    assert server.metric("tessera:prefix_cache_hits_total") - hits == (400 // BLOCK) * BLOCK

    # The same prompt again: everything but its last token comes from the cache, same answer.
    again = complete(client, second)
    assert again.usage.prompt_tokens_details.cached_tokens == ((len(second) - 1) // BLOCK) * BLOCK
    assert again.choices[0].text == b.choices[0].text
    assert again.choices[0].logprobs.token_logprobs == b.choices[0].logprobs.token_logprobs


def test_documents_in_another_order_are_reused(client, idle, tmp_path):
    rng = random.Random(8)
    prefix, docs = random_ids(rng, 20), [random_ids(rng, 48) for _ in range(3)]

    def request(order, question):
        prompt = prefix + [t for d in order for t in docs[d]] + question
        attention = {"segments": {"lengths": [len(docs[d]) for d in order], "shared_prefix": len(prefix),
                                  "positions": "parallel"}}
        return complete(client, prompt, tessera={"attention": attention})

    complete_first = request([0, 1, 2], random_ids(rng, 6))
    question = random_ids(rng, 5)
    warm = request([2, 0, 1], question)
    assert complete_first.usage.prompt_tokens_details.cached_tokens == 0
    # 144 document tokens copied, plus the prefix's first full block from the prefix cache.
    assert warm.usage.prompt_tokens_details.cached_tokens == 144 + (20 // BLOCK) * BLOCK

    # A second server with caching off computes every token: the same answer.
    cold_server = serving.TesseraServer(tmp_path, embedding=False, settings={"prefix_caching": False}).start()
    try:
        cold_client = openai.OpenAI(base_url=cold_server.url + "/v1", api_key=serving.API_KEY, max_retries=0,
                                    timeout=120)
        prompt = prefix + docs[2] + docs[0] + docs[1] + question
        attention = {"segments": {"lengths": [48, 48, 48], "shared_prefix": 20, "positions": "parallel"}}
        cold = complete(cold_client, prompt, tessera={"attention": attention})
    finally:
        assert cold_server.stop() == 0
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.choices[0].text == cold.choices[0].text
    for got, want in zip(warm.choices[0].logprobs.token_logprobs, cold.choices[0].logprobs.token_logprobs):
        assert abs(got - want) < 1e-3
