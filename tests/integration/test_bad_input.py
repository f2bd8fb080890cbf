"""Bad input over HTTP: each gets the right status, an OpenAI error body
{"error": {"message", "type", "param", "code"}} with a message naming the problem, and a valid
request right after still succeeds. (The gRPC equivalents are in test_grpc.py.)"""

from __future__ import annotations

import json

import openai
import pytest
import requests

import serving


def post(server, path, body=None, *, raw: bytes | None = None, headers=None, auth=True):
    h = {"Content-Type": "application/json"}
    if auth:
        h.update(server.auth_headers())
    h.update(headers or {})
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(server.url + path, data=data, headers=h, timeout=120)


def check_error(r, status, *, words=(), param=None, code=None, type_=None):
    assert r.status_code == status, f"{r.status_code} {r.text[:500]}"
    body = r.json()
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, body
    assert isinstance(err["message"], str) and err["message"], body
    assert isinstance(err["type"], str) and err["type"], body
    assert "[check `" not in err["message"], "developer detail leaked to the client"
    for w in words:
        assert w.lower() in err["message"].lower(), f"{w!r} not in {err['message']!r}"
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param), body
    if code is not None:
        assert err["code"] == code, body
    if type_ is not None:
        assert err["type"] == type_, body
    return err


def still_serves(server):
    r = post(server, "/v1/completions", {"model": serving.LLM, "prompt": "Hi", "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1


COMPLETION = {"model": serving.LLM, "prompt": "Hi", "max_tokens": 2}
CHAT = {"model": serving.LLM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
LONG_PROMPT = "hello " * (serving.MAX_MODEL_LEN + 100)


def with_(base, **fields):
    body = dict(base)
    body.update(fields)
    return body


BAD_JSON_CASES = [
    ("malformed JSON", "/v1/completions", b'{"model": "smollm2", "prompt": ', ["json"]),
    ("JSON not an object", "/v1/completions", b'["smollm2", "Hi"]', []),
    ("invalid UTF-8", "/v1/completions", b'{"model": "smollm2", "prompt": "caf\xc3 \xff\xfe", "max_tokens": 2}', ["utf-8"]),
    ("invalid UTF-8 in chat", "/v1/chat/completions",
     b'{"model": "smollm2", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', ["utf-8"]),
    ("empty body", "/v1/chat/completions", b"", []),
]


@pytest.mark.parametrize("name,path,raw,words", BAD_JSON_CASES, ids=[c[0] for c in BAD_JSON_CASES])
def test_unparseable_bodies(server, name, path, raw, words):
    check_error(post(server, path, raw=raw), 400, words=words, type_="invalid_request_error")
    still_serves(server)


FIELD_CASES = [
    # (name, path, body, status, param, words, code)
    ("max_tokens wrong type", "/v1/completions", with_(COMPLETION, max_tokens="ten"), 400, "max_tokens", ["max_tokens"], None),
    ("temperature wrong type", "/v1/completions", with_(COMPLETION, temperature="hot"), 400, "temperature", ["temperature"], None),
    ("prompt wrong type", "/v1/completions", with_(COMPLETION, prompt={"text": "Hi"}), 400, "prompt", ["prompt"], None),
    ("messages wrong type", "/v1/chat/completions", with_(CHAT, messages="Hi"), 400, "messages", ["messages"], None),
    ("message content wrong type", "/v1/chat/completions", with_(CHAT, messages=[{"role": "user", "content": 7}]), 400,
     "messages", ["messages"], None),
    ("stream wrong type", "/v1/completions", with_(COMPLETION, stream="yes"), 400, "stream", ["stream"], None),
    ("model missing", "/v1/completions", {"prompt": "Hi"}, 400, "model", ["model"], None),
    ("negative max_tokens", "/v1/completions", with_(COMPLETION, max_tokens=-1), 400, "max_tokens", ["max_tokens"], None),
    ("zero max_tokens", "/v1/chat/completions", with_(CHAT, max_tokens=0), 400, "max_tokens", ["max_tokens"], None),
    ("huge max_tokens", "/v1/completions", with_(COMPLETION, max_tokens=10**12), 400, None, [], None),
    ("max_tokens over the context", "/v1/completions", with_(COMPLETION, max_tokens=serving.MAX_MODEL_LEN * 4), 400,
     None, ["maximum context length is %d tokens" % serving.MAX_MODEL_LEN], "context_length_exceeded"),
    ("prompt over the context", "/v1/completions", with_(COMPLETION, prompt=LONG_PROMPT), 400, None,
     ["maximum context length is %d tokens" % serving.MAX_MODEL_LEN, "in your prompt"], "context_length_exceeded"),
    ("chat over the context", "/v1/chat/completions",
     with_(CHAT, messages=[{"role": "user", "content": LONG_PROMPT}]), 400, None,
     ["maximum context length is %d tokens" % serving.MAX_MODEL_LEN, "in the messages"], "context_length_exceeded"),
    ("top_p out of range", "/v1/completions", with_(COMPLETION, top_p=1.5), 400, "top_p", ["top_p"], None),
    ("unknown model", "/v1/completions", with_(COMPLETION, model="gpt-17"), 404, None, ["gpt-17"], "model_not_found"),
    ("unknown model (chat)", "/v1/chat/completions", with_(CHAT, model="gpt-17"), 404, None, ["gpt-17"], "model_not_found"),
    ("embedding model asked to generate", "/v1/completions", with_(COMPLETION, model=serving.EMBEDDING), 400, None,
     [serving.EMBEDDING], None),
    ("generation model asked to embed", "/v1/embeddings", {"model": serving.LLM, "input": "Hi"}, 400, None,
     [serving.LLM], None),
    ("unknown embedding model", "/v1/embeddings", {"model": "nope", "input": "Hi"}, 404, None, ["nope"], "model_not_found"),
    ("embedding input wrong type", "/v1/embeddings", {"model": serving.EMBEDDING, "input": {"a": 1}}, 400, "input",
     ["input"], None),
    # Truncation is the default; truncate=false refuses an input over MiniLM's limit, naming it.
    ("embedding input over the limit with truncate false", "/v1/embeddings",
     {"model": serving.EMBEDDING, "input": ["A short one.", serving.over_limit_texts(300)[0]], "truncate": False}, 400,
     "input", ["input[1] has 300 tokens", "limit of %d (max_seq_length)" % serving.EMBEDDING_LIMIT, "truncate"],
     "context_length_exceeded"),
    ("embedding truncate not a bool", "/v1/embeddings", {"model": serving.EMBEDDING, "input": "x", "truncate": "yes"},
     400, "truncate", ["truncate", "boolean"], None),
    ("embedding truncate a number", "/v1/embeddings", {"model": serving.EMBEDDING, "input": "x", "truncate": 1},
     400, "truncate", ["truncate", "boolean"], None),
    ("bad mask policy: window 0", "/v1/completions",
     with_(COMPLETION, tessera={"attention": {"sliding_window": {"window": 0, "sinks": 0}}}), 400, "tessera.attention",
     ["window"], None),
    ("bad mask policy: unknown kind", "/v1/completions",
     with_(COMPLETION, tessera={"attention": {"diagonal": {}}}), 400, "tessera.attention", ["diagonal"], None),
    ("bad mask policy: segments longer than the prompt", "/v1/completions",
     with_(COMPLETION, tessera={"attention": {"segments": {"lengths": [50, 50]}}}), 400, "tessera.attention",
     ["segment"], None),
    ("bidirectional prompt on a decoder", "/v1/completions",
     with_(COMPLETION, tessera={"attention": {"bidirectional": {}}}), 400, "tessera.attention",
     ["bidirectional", "causal"], None),
    ("bad mask policy: window wrong type", "/v1/chat/completions",
     with_(CHAT, tessera={"attention": {"sliding_window": {"window": "wide"}}}), 400, "tessera.attention",
     ["window"], None),
    ("unknown tessera field", "/v1/completions", with_(COMPLETION, tessera={"speed": "fast"}), 400, "tessera",
     ["speed"], None),
]


@pytest.mark.parametrize("name,path,body,status,param,words,code", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_bad_fields(server, name, path, body, status, param, words, code):
    check_error(post(server, path, body), status, param=param, words=words, code=code)
    still_serves(server)


def test_oversized_body(server):
    body = with_(COMPLETION, prompt="x" * (serving.MAX_BODY_BYTES + 4096))
    check_error(post(server, "/v1/completions", body), 413)
    still_serves(server)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-key"}, {"Authorization": serving.API_KEY},
                                     {"Authorization": "Basic " + serving.API_KEY}],
                         ids=["missing", "wrong", "no Bearer", "Basic"])
@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT),
                                       ("/v1/embeddings", {"model": serving.EMBEDDING, "input": "x"})],
                         ids=["completions", "chat", "embeddings"])
def test_missing_or_wrong_key(server, headers, path, body):
    check_error(post(server, path, body, headers=headers, auth=False), 401)
    still_serves(server)


def test_models_needs_the_key_but_health_and_metrics_do_not(server):
    assert requests.get(server.url + "/v1/models", timeout=10).status_code == 401
    assert requests.get(server.url + "/v1/models", headers=server.auth_headers(), timeout=10).status_code == 200
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert requests.get(server.url + "/ready", timeout=10).status_code == 200
    assert requests.get(server.url + "/metrics", timeout=10).status_code == 200


def test_sdk_raises_the_matching_exceptions(server, client):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).completions.create(
            model=serving.LLM, prompt="Hi", max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-17", prompt="Hi", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=serving.LLM, messages=[{"role": "user", "content": LONG_PROMPT}],
                                       max_tokens=4)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=serving.LLM, prompt="Hi", max_tokens=-3)
    assert info.value.param == "max_tokens"
    still_serves(server)
