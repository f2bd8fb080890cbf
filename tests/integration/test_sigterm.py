"""SIGTERM during active streams: /ready turns 503, gRPC health NOT_SERVING, and new work is refused at
once; the streams in flight finish completely, and the process exits 0. Runs its own server (the session one must live)."""

from __future__ import annotations

import threading

import grpc
import openai
from grpc_health.v1 import health_pb2, health_pb2_grpc
import pytest
import requests

import serving

GRPC_TOKENS = 48
HTTP_TOKENS = 24


def test_sigterm_drains_active_streams(tmp_path, pb):
    pb2, pb2_grpc = pb
    srv = serving.TesseraServer(tmp_path, embedding=False, drain_timeout_s=120).start()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=serving.API_KEY, max_retries=0, timeout=120)
        channel = grpc.insecure_channel(srv.grpc_target)
        stub = pb2_grpc.InferenceServiceStub(channel)
        streaming = threading.Barrier(6 + 1, timeout=120)
        results: dict[str, object] = {}

        def http_stream(i):
            try:
                usage, finish, first = None, None, True
                for chunk in client.completions.create(model=serving.LLM, prompt=f"Tell a story about ship number {i}.",
                                                       max_tokens=HTTP_TOKENS, temperature=0, stream=True,
                                                       stream_options={"include_usage": True}):
                    if first:
                        first = False
                        streaming.wait()
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                    if chunk.usage:
                        usage = chunk.usage.completion_tokens
                results[f"http{i}"] = (finish, usage)
            except BaseException as e:  # reported by the assertion below
                results[f"http{i}"] = e

        def grpc_stream(i):
            try:
                request = pb2.GenerateRequest(model=serving.LLM, text=f"Describe harbour number {i}.",
                                              max_tokens=GRPC_TOKENS,
                                              sampling=pb2.SamplingParams(temperature=0, ignore_eos=True))
                chunks = []
                for chunk in stub.Generate(request, metadata=srv.grpc_metadata(), timeout=120):
                    if not chunks:
                        streaming.wait()
                    chunks.append(chunk)
                results[f"grpc{i}"] = (chunks[-1].finish_reason, chunks[-1].usage.completion_tokens)
            except BaseException as e:
                results[f"grpc{i}"] = e

        threads = [threading.Thread(target=http_stream, args=(i,)) for i in range(4)]
        threads += [threading.Thread(target=grpc_stream, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        streaming.wait()  # every stream has its first chunk

        srv.terminate()
        # While the streams run: not ready, still live, new work refused (HTTP 503, gRPC UNAVAILABLE).
        ready = serving.wait_for(lambda: requests.get(srv.url + "/ready", timeout=5).status_code == 503 or None, 5,
                                 0.02, "/ready to return 503 after SIGTERM")
        assert ready
        assert requests.get(srv.url + "/health", timeout=5).status_code == 200
        refused = requests.post(srv.url + "/v1/completions", headers=srv.auth_headers(), timeout=30,
                                json={"model": serving.LLM, "prompt": "Hi", "max_tokens": 1})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["message"]
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(pb2.GenerateRequest(model=serving.LLM, text="Hi", max_tokens=1),
                               metadata=srv.grpc_metadata(), timeout=30))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        in_flight_when_checked = sum(1 for t in threads if t.is_alive())
        assert in_flight_when_checked > 0, "the streams ended before the drain could be observed"

        for t in threads:
            t.join(180)
        channel.close()
        failures = {k: v for k, v in results.items() if isinstance(v, BaseException)}
        assert not failures, failures
        assert len(results) == 6
        for i in range(2):
            assert results[f"grpc{i}"] == (pb2.FINISH_REASON_LENGTH, GRPC_TOKENS)
        for i in range(4):
            finish, usage = results[f"http{i}"]
            assert finish in ("length", "stop") and 1 <= usage <= HTTP_TOKENS

        code = srv.wait(60)
        assert code == 0, f"exit code {code}; log:\n{srv.log_tail()}"
    finally:
        srv.kill()
