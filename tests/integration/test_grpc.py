"""A grpcio client generated from proto/tessera/v1 at test time: streamed Generate, cancel mid-stream
(KV blocks freed, seen in /metrics), deadline exceeded, health, reflection, the other RPCs, and the
error codes of bad input."""

from __future__ import annotations

import math
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import serving

SERVICE = "tessera.v1.InferenceService"
PROMPT = "The capital of France is"


def md(server):
    return server.grpc_metadata()


def collect(stream):
    chunks = list(stream)
    return chunks, "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids]


def test_generate_streams_the_same_text_as_http(server, stub, pb, client):
    pb2 = pb[0]
    request = pb2.GenerateRequest(model=serving.LLM, text=PROMPT, max_tokens=12, request_id="grpc-stream-1",
                                  sampling=pb2.SamplingParams(temperature=0))
    call = stub.Generate(request, metadata=md(server), timeout=120)
    chunks, text, tokens = collect(call)
    assert dict(call.initial_metadata()).get("x-request-id") == "grpc-stream-1"
    assert len(chunks) >= 2
    assert all(c.request_id == "grpc-stream-1" for c in chunks)
    final = chunks[-1]
    assert final.finish_reason in (pb2.FINISH_REASON_LENGTH, pb2.FINISH_REASON_STOP)
    assert all(c.finish_reason == pb2.FINISH_REASON_UNSPECIFIED for c in chunks[:-1])
    assert all(not c.HasField("usage") for c in chunks[:-1])
    assert final.usage.completion_tokens == len(tokens)
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens
    http = client.completions.create(model=serving.LLM, prompt=PROMPT, max_tokens=12, temperature=0)
    assert text == http.choices[0].text
    assert final.usage.prompt_tokens == http.usage.prompt_tokens


def test_generate_from_token_ids_and_chat(server, stub, pb):
    pb2 = pb[0]
    ids = stub.Tokenize(pb2.TokenizeRequest(model=serving.LLM, text=PROMPT), metadata=md(server)).token_ids
    by_text = collect(stub.Generate(pb2.GenerateRequest(model=serving.LLM, text=PROMPT, max_tokens=6,
                                                        sampling=pb2.SamplingParams(temperature=0)),
                                    metadata=md(server), timeout=120))
    by_ids = collect(stub.Generate(pb2.GenerateRequest(model=serving.LLM, token_ids=pb2.TokenIds(ids=ids), max_tokens=6,
                                                       sampling=pb2.SamplingParams(temperature=0)),
                                   metadata=md(server), timeout=120))
    assert by_text[1] == by_ids[1] and by_text[2] == by_ids[2]
    chat = pb2.ChatMessages(messages=[pb2.ChatMessage(role="user", content="Say hello.")])
    chunks, text, _ = collect(stub.Generate(pb2.GenerateRequest(model=serving.LLM, chat=chat, max_tokens=6,
                                                                sampling=pb2.SamplingParams(temperature=0)),
                                            metadata=md(server), timeout=120))
    assert chunks[-1].usage.completion_tokens >= 1 and isinstance(text, str)


def test_generate_with_sliding_window_policy(server, stub, pb):
    pb2 = pb[0]
    attention = pb2.AttentionPolicy(sliding_window=pb2.AttentionPolicy.SlidingWindow(window=4, sinks=1))
    chunks, _, tokens = collect(stub.Generate(pb2.GenerateRequest(model=serving.LLM, text=PROMPT, max_tokens=4,
                                                                  attention=attention,
                                                                  sampling=pb2.SamplingParams(temperature=0)),
                                              metadata=md(server), timeout=120))
    assert chunks[-1].usage.completion_tokens == len(tokens) >= 1


def test_parallel_segments_match_http(server, stub, pb, client):
    # The same token prompt and parallel-positions segments through gRPC and HTTP: the same text.
    pb2 = pb[0]
    ids = list(range(1000, 1040))
    attention = pb2.AttentionPolicy(segments=pb2.AttentionPolicy.Segments(lengths=[12, 12], shared_prefix=8,
                                                                         parallel_positions=True))
    _, text, _ = collect(stub.Generate(pb2.GenerateRequest(model=serving.LLM, token_ids=pb2.TokenIds(ids=ids),
                                                           max_tokens=4, attention=attention,
                                                           sampling=pb2.SamplingParams(temperature=0)),
                                       metadata=md(server), timeout=120))
    http = client.completions.create(model=serving.LLM, prompt=ids, max_tokens=4, temperature=0, extra_body={
        "tessera": {"attention": {"segments": {"lengths": [12, 12], "shared_prefix": 8, "positions": "parallel"}}}})
    assert text == http.choices[0].text


def kv_state(server):
    text = server.metrics_text()
    return (serving.metric_value(text, "tessera:num_requests_running"),
            serving.metric_value(text, "tessera:kv_cache_usage_perc"))


def long_request(pb2, max_tokens=400):
    # ignore_eos: the stream cannot end by itself before the test acts on it.
    return pb2.GenerateRequest(model=serving.LLM, text="Write a long story about a lighthouse keeper.",
                               max_tokens=max_tokens, sampling=pb2.SamplingParams(temperature=0, ignore_eos=True))


def test_cancel_mid_stream_frees_kv(idle, stub, pb):
    server = idle
    assert kv_state(server) == (0, 0)
    call = stub.Generate(long_request(pb[0]), metadata=md(server), timeout=300)
    received = 0
    for _ in call:
        received += 1
        if received == 3:
            break
    running, usage = kv_state(server)
    assert running == 1 and usage > 0, "the request should hold KV blocks while it streams"
    call.cancel()
    with pytest.raises(grpc.RpcError) as info:
        next(call)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    # The engine frees the sequence within a step once the handler sees the cancel.
    serving.wait_for(lambda: kv_state(server) == (0, 0), 10, what="KV freed after cancel")


def test_deadline_exceeded(idle, stub, pb):
    server = idle
    started = time.monotonic()
    # 1,000 tokens take far longer than 0.3 s on either backend (a GPU streams ~1,000 tok/s).
    with pytest.raises(grpc.RpcError) as info:
        for _ in stub.Generate(long_request(pb[0], max_tokens=1000), metadata=md(server), timeout=0.3):
            pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 10
    serving.wait_for(lambda: kv_state(server) == (0, 0), 10, what="KV freed after the deadline")


def test_health(server, channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_service(server, channel):
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = list(reflection.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
    ]), timeout=10))
    services = {s.name for s in responses[0].list_services_response.service}
    assert SERVICE in services
    assert "grpc.reflection.v1alpha.ServerReflection" in services
    assert responses[1].file_descriptor_response.file_descriptor_proto  # the proto itself is served


def test_embed_tokenize_detokenize_list_models(server, stub, pb):
    pb2 = pb[0]
    e = stub.Embed(pb2.EmbedRequest(model=serving.EMBEDDING, inputs=["hello world", "goodbye"]), metadata=md(server),
                   timeout=60)
    assert len(e.embeddings) == 2 and all(len(x.values) == 384 for x in e.embeddings)
    assert abs(sum(v * v for v in e.embeddings[0].values) - 1.0) < 1e-4
    assert e.usage.prompt_tokens > 0
    t = stub.Tokenize(pb2.TokenizeRequest(model=serving.LLM, text="Hello there"), metadata=md(server))
    assert len(t.token_ids) == len(t.tokens) >= 2 and t.max_model_len == serving.MAX_MODEL_LEN
    d = stub.Detokenize(pb2.DetokenizeRequest(model=serving.LLM, token_ids=t.token_ids, skip_special_tokens=True),
                        metadata=md(server))
    assert d.text == "Hello there"
    models = stub.ListModels(pb2.ListModelsRequest(), metadata=md(server)).models
    tasks = {m.id: m.task for m in models}
    assert tasks == {serving.LLM: "generate", serving.EMBEDDING: "embed"}


@pytest.mark.skipif(not serving.WITH_EMBEDDING, reason="the embedding model is not served")
def test_embed_truncates_by_default_and_refuses_when_asked_not_to(server, stub, pb):
    pb2 = pb[0]
    long, head, late = serving.over_limit_texts(300)

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    for truncate in (None, True):  # unset means true
        fields = {} if truncate is None else {"truncate": truncate}
        e = stub.Embed(pb2.EmbedRequest(model=serving.EMBEDDING, inputs=[long, head, late], **fields),
                       metadata=md(server), timeout=120)
        long_e, head_e, late_e = (list(x.values) for x in e.embeddings)
        assert cosine(long_e, head_e) > 0.9999  # truncated to 256 tokens, keeping [SEP]
        assert cosine(long_e, late_e) < 0.95    # the end was cut, not the start
        assert e.usage.prompt_tokens == 3 * serving.EMBEDDING_LIMIT  # tokens embedded, after truncation

    err = expect_error(lambda: stub.Embed(pb2.EmbedRequest(model=serving.EMBEDDING, inputs=["short", long], truncate=False),
                                          metadata=md(server), timeout=60),
                       grpc.StatusCode.INVALID_ARGUMENT, "input[1] has 300 tokens",
                       "limit of %d (max_seq_length)" % serving.EMBEDDING_LIMIT, "truncate")
    assert "[check `" not in err.details()
    # Within the limit, truncate=false changes nothing.
    ok = stub.Embed(pb2.EmbedRequest(model=serving.EMBEDDING, inputs=[head], truncate=False), metadata=md(server),
                    timeout=60)
    assert ok.usage.prompt_tokens == serving.EMBEDDING_LIMIT


# ---- bad input: each gets its code and a message naming the problem; a good request still works ----

def expect_error(fn, code, *words):
    with pytest.raises(grpc.RpcError) as info:
        fn()
    assert info.value.code() == code, info.value.details()
    details = info.value.details().lower()
    for word in words:
        assert word.lower() in details, f"{word!r} not in {info.value.details()!r}"
    return info.value


def good_generate(server, stub, pb2):
    chunks = list(stub.Generate(pb2.GenerateRequest(model=serving.LLM, text="Hi", max_tokens=2,
                                                    sampling=pb2.SamplingParams(temperature=0)),
                                metadata=md(server), timeout=120))
    assert chunks[-1].usage.completion_tokens >= 1


def test_grpc_bad_input(server, stub, pb):
    pb2 = pb[0]

    def gen(metadata=None, **fields):
        fields.setdefault("model", serving.LLM)
        req = pb2.GenerateRequest(**fields)
        return lambda: list(stub.Generate(req, metadata=md(server) if metadata is None else metadata, timeout=60))

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (gen(text="Hi", metadata=()), grpc.StatusCode.UNAUTHENTICATED, []),
        (gen(text="Hi", metadata=(("authorization", "Bearer wrong-key"),)), grpc.StatusCode.UNAUTHENTICATED, []),
        (gen(text="Hi", metadata=(("authorization", serving.API_KEY),)), grpc.StatusCode.UNAUTHENTICATED, []),
        (gen(model="no-such-model", text="Hi"), grpc.StatusCode.NOT_FOUND, ["no-such-model"]),
        # Generating from the embedding model is invalid; without it served, the model is unknown.
        (gen(model=serving.EMBEDDING, text="Hi"), invalid if serving.WITH_EMBEDDING else grpc.StatusCode.NOT_FOUND, []),
        (gen(), invalid, ["input"]),
        (gen(text="Hi", max_tokens=0), invalid, ["max_tokens"]),
        (gen(text="Hi", max_tokens=-5), invalid, ["max_tokens"]),
        (gen(text="Hi", max_tokens=2_000_000_000), invalid, ["context length"]),
        (gen(text="hello " * (serving.MAX_MODEL_LEN + 50), max_tokens=4), invalid,
         ["maximum context length is %d" % serving.MAX_MODEL_LEN]),
        (gen(token_ids=pb2.TokenIds(ids=[1, 10**8]), max_tokens=2), invalid, []),
        (gen(text="Hi", sampling=pb2.SamplingParams(temperature=-1)), invalid, ["temperature"]),
        (gen(text="Hi", sampling=pb2.SamplingParams(top_p=1.5)), invalid, ["top_p"]),
        (gen(text="Hi", attention=pb2.AttentionPolicy()), invalid, ["attention"]),
        (gen(text="Hi", attention=pb2.AttentionPolicy(
            sliding_window=pb2.AttentionPolicy.SlidingWindow(window=0))), invalid, ["window"]),
        (gen(text="Hi", attention=pb2.AttentionPolicy(
            segments=pb2.AttentionPolicy.Segments(lengths=[100, 100]))), invalid, ["segment"]),
    ]
    for fn, code, words in cases:
        expect_error(fn, code, *words)
        good_generate(server, stub, pb2)

    expect_error(lambda: stub.Embed(pb2.EmbedRequest(model=serving.EMBEDDING, inputs=["x"]), timeout=30),
                 grpc.StatusCode.UNAUTHENTICATED)
    expect_error(lambda: stub.Embed(pb2.EmbedRequest(model="nope", inputs=["x"]), metadata=md(server), timeout=30),
                 grpc.StatusCode.NOT_FOUND)
    expect_error(lambda: stub.Embed(pb2.EmbedRequest(model=serving.EMBEDDING), metadata=md(server), timeout=30),
                 invalid if serving.WITH_EMBEDDING else grpc.StatusCode.NOT_FOUND)
    expect_error(lambda: stub.Detokenize(pb2.DetokenizeRequest(model=serving.LLM, token_ids=[10**8]),
                                         metadata=md(server), timeout=30), invalid)
    expect_error(lambda: stub.Tokenize(pb2.TokenizeRequest(model=serving.LLM), metadata=md(server), timeout=30),
                 invalid, "input")
    good_generate(server, stub, pb2)


def test_cancel_of_many_streams_frees_all_kv(idle, stub, pb):
    server = idle
    calls = [stub.Generate(long_request(pb[0]), metadata=md(server), timeout=300) for _ in range(6)]
    started = threading.Barrier(len(calls) + 1, timeout=120)

    def read_one(call):
        it = iter(call)
        next(it)
        started.wait()
        try:
            for _ in it:
                pass
        except grpc.RpcError:
            pass

    threads = [threading.Thread(target=read_one, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    started.wait()
    assert kv_state(server)[1] > 0
    for c in calls:
        c.cancel()
    for t in threads:
        t.join(30)
    serving.wait_for(lambda: kv_state(server) == (0, 0), 10, what="KV freed after 6 cancels")
