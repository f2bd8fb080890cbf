"""Prefix caching and per-document KV reuse through the OpenAI SDK, on a server with the cache on
and one with it off: a prompt sharing a long prefix with an earlier one reports its reused tokens in
usage.prompt_tokens_details.cached_tokens and the tessera:prefix_cache_* counters, and answers as it
did cold; documents sent again in another order (tessera.attention.segments with parallel positions)
are reused and answer as the server without a cache does.

On the CPU the answers must be equal (the same text, logprobs to float rounding). On the GPU a
prompt computed in one chunk and a tail computed over reused K/V round differently in bf16, so the
first token must agree unless the cold run's top two are within that rounding, and its logprob must
be within it."""

from __future__ import annotations

import random

import openai
import pytest

import serving

BLOCK = 16  # tokens per KV block (the server's default)
BF16_LOGPROB_TOLERANCE = 0.15  # a prompt row's logprob, GPU against GPU over another chunking (H100: <= 0.11)


def server_with_cache(tmp_path_factory, on: bool):
    srv = serving.TesseraServer(tmp_path_factory.mktemp("cache_on" if on else "cache_off"), embedding=False,
                                settings={"prefix_caching": on}).start()
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    yield from server_with_cache(tmp_path_factory, True)


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    yield from server_with_cache(tmp_path_factory, False)


def client_of(server: serving.TesseraServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=serving.API_KEY, max_retries=0, timeout=120)


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


def complete(server, prompt, **extra):
    return client_of(server).completions.create(model=serving.LLM, prompt=prompt, max_tokens=8, temperature=0,
                                                logprobs=2, extra_body=extra or None)


def expect_same_answer(got, want):
    g, w = got.choices[0].logprobs, want.choices[0].logprobs
    if serving.BACKEND == "cpu":
        assert got.choices[0].text == want.choices[0].text
        assert g.token_logprobs == pytest.approx(w.token_logprobs, abs=1e-3)
        return
    top_two = sorted(w.top_logprobs[0].values(), reverse=True)[:2]
    if len(top_two) == 2 and top_two[0] - top_two[1] > BF16_LOGPROB_TOLERANCE:
        assert g.tokens[0] == w.tokens[0]
        assert g.token_logprobs[0] == pytest.approx(w.token_logprobs[0], abs=BF16_LOGPROB_TOLERANCE)


def test_a_shared_prefix_is_reused_and_counted(warm, cold):
    rng = random.Random(5)
    prefix = random_ids(rng, 400)
    first, second = prefix + random_ids(rng, 7), prefix + random_ids(rng, 9)
    queries = warm.metric("tessera:prefix_cache_queries_total")
    hits = warm.metric("tessera:prefix_cache_hits_total")

    a = complete(warm, first)
    b = complete(warm, second)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens == (400 // BLOCK) * BLOCK
    assert warm.metric("tessera:prefix_cache_queries_total") - queries == len(first) + len(second)
    assert warm.metric("tessera:prefix_cache_hits_total") - hits == (400 // BLOCK) * BLOCK
    expect_same_answer(b, complete(cold, second))

    # The same prompt again: everything but its last token comes from the cache.
    again = complete(warm, second)
    assert again.usage.prompt_tokens_details.cached_tokens == ((len(second) - 1) // BLOCK) * BLOCK
    expect_same_answer(again, b)


def test_documents_in_another_order_are_reused(warm, cold):
    rng = random.Random(8)
    prefix, docs = random_ids(rng, 20), [random_ids(rng, 48) for _ in range(3)]
    attention = {"segments": {"lengths": [48, 48, 48], "shared_prefix": len(prefix), "positions": "parallel"}}

    def prompt(order, question):
        return prefix + [t for d in order for t in docs[d]] + question

    first = complete(warm, prompt([0, 1, 2], random_ids(rng, 6)), tessera={"attention": attention})
    reordered = prompt([2, 0, 1], random_ids(rng, 5))
    got = complete(warm, reordered, tessera={"attention": attention})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # 144 document tokens copied, plus the prefix's first full block from the prefix cache.
    assert got.usage.prompt_tokens_details.cached_tokens == 144 + (20 // BLOCK) * BLOCK
    want = complete(cold, reordered, tessera={"attention": attention})
    assert want.usage.prompt_tokens_details.cached_tokens == 0
    expect_same_answer(got, want)
