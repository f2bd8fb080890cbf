"""The official `openai` Python SDK against `tessera serve`: completions, chat (streamed and not),
embeddings (base64 and float; inputs over the model's limit truncated as sentence-transformers does),
models; greedy output equals `tessera generate`'s."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest
import requests

import serving

PROMPT = "The capital of France is"
CHAT = "Name three colours."
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def reference_prompt():
    return serving.reference_generate(prompt=PROMPT, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def reference_chat():
    return serving.reference_generate(chat=CHAT, max_tokens=MAX_TOKENS)


def test_completion_greedy_equals_tessera_generate(client, reference_prompt):
    text, line = reference_prompt
    r = client.completions.create(model=serving.LLM, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert r.object == "text_completion"
    assert r.model == serving.LLM
    assert len(r.choices) == 1
    assert r.choices[0].text == text
    assert r.choices[0].finish_reason == line["finish_reason"]
    assert r.usage.prompt_tokens == line["usage"]["prompt_tokens"]
    assert r.usage.completion_tokens == line["usage"]["completion_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_streamed_equals_unstreamed(client, reference_prompt):
    text, line = reference_prompt
    chunks = list(client.completions.create(model=serving.LLM, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert len(chunks) >= 3  # the text arrives in pieces, then the usage chunk
    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in content) == text
    assert content[-1].choices[0].finish_reason == line["finish_reason"]
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == line["usage"]["completion_tokens"]
    assert usage_chunk.usage.prompt_tokens == line["usage"]["prompt_tokens"]
    assert len({c.id for c in chunks}) == 1


def test_chat_greedy_equals_tessera_generate(client, reference_chat):
    text, line = reference_chat
    r = client.chat.completions.create(model=serving.LLM, messages=[{"role": "user", "content": CHAT}],
                                       max_tokens=MAX_TOKENS, temperature=0)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert msg.content == text
    assert r.choices[0].finish_reason == line["finish_reason"]
    assert r.usage.prompt_tokens == line["usage"]["prompt_tokens"]
    assert r.usage.completion_tokens == line["usage"]["completion_tokens"]


def test_chat_streamed_equals_unstreamed(client, reference_chat):
    text, line = reference_chat
    stream = client.chat.completions.create(model=serving.LLM, messages=[{"role": "user", "content": CHAT}],
                                            max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == text
    assert content[-1].choices[0].finish_reason == line["finish_reason"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == line["usage"]["completion_tokens"]


def test_chat_unknown_harmless_field_is_accepted(client):
    # `user` does not change results, so it is accepted (as OpenAI and vLLM do).
    r = client.chat.completions.create(model=serving.LLM, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=2, temperature=0, user="integration-test")
    assert r.usage.completion_tokens >= 1


def _norm(v):
    return math.sqrt(sum(x * x for x in v))


def test_embeddings_base64_and_float(client):
    texts = ["The cat sat on the mat.", "Quarterly revenue rose by four percent.", "The cat sat on the mat."]
    # The SDK asks for base64 by default and decodes it; ask for floats explicitly too.
    b64 = client.embeddings.create(model=serving.EMBEDDING, input=texts)
    flt = client.embeddings.create(model=serving.EMBEDDING, input=texts, encoding_format="float")
    for r in (b64, flt):
        assert r.model == serving.EMBEDDING
        assert [d.index for d in r.data] == [0, 1, 2]
        assert all(len(d.embedding) == 384 for d in r.data)
        assert all(abs(_norm(d.embedding) - 1.0) < 1e-4 for d in r.data)
        assert r.usage.prompt_tokens > 0
    for a, b in zip(b64.data, flt.data):
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-6
    same = sum(x * y for x, y in zip(flt.data[0].embedding, flt.data[2].embedding))
    different = sum(x * y for x, y in zip(flt.data[0].embedding, flt.data[1].embedding))
    assert same > 0.9999 and different < 0.5


def test_embeddings_equal_tessera_embed(client):
    # The third is over MiniLM's 256-token limit: the CLI and the server truncate it the same way.
    texts = ["Tessera serves embeddings.", "A second, longer sentence about something else entirely.",
             serving.over_limit_texts()[0]]
    out = subprocess.run([str(serving.tessera_binary()), "embed", "--model", str(serving.model_dir() / serving.EMBEDDING_DIR),
                          *texts], capture_output=True, check=True, timeout=120,
                         env=dict(os.environ, TESSERA_MODEL_DIR=str(serving.model_dir()))).stdout.decode()
    expected = [json.loads(line)["embedding"] for line in out.splitlines() if line.strip()]
    r = client.embeddings.create(model=serving.EMBEDDING, input=texts, encoding_format="float")
    assert len(expected) == len(r.data) == 3
    # `tessera embed` runs on the CPU in fp32. A CPU server is fp32 too (summation-order differences
    # only); a GPU server rounds activations to bf16, about 2e-3 per component (cosine >= 0.9995 in
    # tests/gpu/backend/test_cuda_bert.cpp), so there it is held to 2 bf16 ulps of a unit vector.
    tolerance = 1e-4 if serving.BACKEND == "cpu" else 7.8e-3
    for want, got in zip(expected, r.data):
        assert max(abs(x - y) for x, y in zip(want, got.embedding)) < tolerance


def _cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b)) / (_norm(a) * _norm(b))


def _token_count(server, text: str) -> dict:
    r = requests.post(server.url + "/tokenize", json={"model": serving.EMBEDDING, "prompt": text},
                      headers=server.auth_headers(), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.skipif(not serving.WITH_EMBEDDING, reason="the embedding model is not served")
def test_long_embedding_input_is_truncated_like_sentence_transformers(server, client):
    long, head, late = serving.over_limit_texts(300)
    counts = [_token_count(server, t) for t in (long, head, late)]
    assert [c["count"] for c in counts] == [300, serving.EMBEDDING_LIMIT, serving.EMBEDDING_LIMIT]
    assert counts[0]["max_model_len"] == serving.EMBEDDING_LIMIT  # the limit is reported, not 512
    short = "A short sentence."
    for extra in ({}, {"truncate": True}):  # truncation is the default
        r = client.embeddings.create(model=serving.EMBEDDING, input=[long, head, late, short], encoding_format="float",
                                     extra_body=extra)
        long_e, head_e, late_e, _ = (d.embedding for d in r.data)
        assert _cosine(long_e, head_e) > 0.9999  # [CLS] + the first 254 words + [SEP]
        assert _cosine(long_e, late_e) < 0.95    # the end is what was cut
        # usage counts the tokens embedded: 256 for each long input, not 300.
        assert r.usage.prompt_tokens == 3 * serving.EMBEDDING_LIMIT + _token_count(server, short)["count"]


def test_models_list(client):
    ids = {m.id for m in client.models.list()}
    assert {serving.LLM, serving.EMBEDDING} <= ids
