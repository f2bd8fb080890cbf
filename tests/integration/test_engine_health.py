"""The health check sees the engine: a step slower than limits.engine_stall_timeout_s turns /health,
/ready and gRPC health to 503 / NOT_SERVING while work is pending, and back once it is done; a step
that fails as a sticky backend error would (debug.fail_step) ends the in-flight stream with an error
and then the process with exit code 70, or, with limits.exit_on_fatal_error false, leaves it up with
/ready 503. Each test runs its own server with the test switches."""

from __future__ import annotations

import json
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
import requests

import serving

FATAL_EXIT_CODE = 70


def start_server(tmp_path, limits: dict, debug: dict) -> serving.TesseraServer:
    return serving.TesseraServer(tmp_path, embedding=False, settings={"limits": limits, "debug": debug}).start()


def complete(srv: serving.TesseraServer, max_tokens: int, stream: bool = False) -> requests.Response:
    body = {"model": serving.LLM, "prompt": "Name a colour.", "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}
    return requests.post(srv.url + "/v1/completions", json=body, headers=srv.auth_headers(), stream=stream,
                         timeout=120)


def grpc_health_status(srv: serving.TesseraServer) -> int:
    with grpc.insecure_channel(srv.grpc_target) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def unhealthy_body(srv: serving.TesseraServer) -> dict | None:
    response = requests.get(srv.url + "/health", timeout=5)
    return response.json() if response.status_code == 503 else None


def test_a_stalled_step_turns_health_503_and_back(tmp_path):
    srv = start_server(tmp_path, {"engine_stall_timeout_s": 1}, {"step_delay_ms": 3000})
    try:
        assert requests.get(srv.url + "/health", timeout=5).status_code == 200
        sent = time.monotonic()
        result = {}
        worker = threading.Thread(target=lambda: result.update(response=complete(srv, max_tokens=1)))
        worker.start()
        body = serving.wait_for(lambda: unhealthy_body(srv), 4, 0.05, "/health 503")
        assert time.monotonic() - sent <= 1 + 1 + 0.5  # the timeout, a second, and the request's own start
        assert body["status"] == "unhealthy" and body["reason"].startswith("engine stalled: no step finished for")
        assert "1 request waiting or running" in body["reason"]
        assert requests.get(srv.url + "/ready", timeout=5).status_code == 503
        serving.wait_for(lambda: grpc_health_status(srv) == health_pb2.HealthCheckResponse.NOT_SERVING or None, 2,
                         0.05, "gRPC NOT_SERVING")
        assert srv.metric("tessera:engine_seconds_since_last_step") > 1
        worker.join(timeout=60)
        assert result["response"].status_code == 200, result["response"].text
        serving.wait_for(lambda: requests.get(srv.url + "/health", timeout=5).status_code == 200 or None, 2, 0.05,
                         "/health 200 again")
        assert requests.get(srv.url + "/ready", timeout=5).status_code == 200
        serving.wait_for(lambda: grpc_health_status(srv) == health_pb2.HealthCheckResponse.SERVING or None, 2, 0.05,
                         "gRPC SERVING again")
    finally:
        assert srv.stop() == 0, srv.log_tail()


def stream_until_error(srv: serving.TesseraServer) -> dict:
    """Streams a completion whose third engine step fails; returns the error event's body."""
    response = complete(srv, max_tokens=16, stream=True)
    assert response.status_code == 200
    for line in response.iter_lines():
        if line.startswith(b"data: {"):
            event = json.loads(line[len(b"data: "):])
            if "error" in event:
                return event
    raise AssertionError("the stream ended without an error event")


def test_a_failed_step_errors_the_stream_then_exits_nonzero(tmp_path):
    srv = start_server(tmp_path, {}, {"fail_step": 3})
    try:
        error = stream_until_error(srv)
        failed_at = time.monotonic()
        assert error["error"]["message"]
        code = srv.wait(timeout_s=10)
        assert code == FATAL_EXIT_CODE, srv.log_tail()
        assert time.monotonic() - failed_at <= 2.0
        assert "exiting with code 70" in srv.log_tail()
    finally:
        srv.kill()


def test_a_failed_step_with_exit_off_stays_up_unready(tmp_path):
    srv = start_server(tmp_path, {"exit_on_fatal_error": False}, {"fail_step": 3})
    try:
        stream_until_error(srv)
        time.sleep(1.5)
        assert srv.proc.poll() is None, srv.log_tail()
        ready = requests.get(srv.url + "/ready", timeout=5)
        assert ready.status_code == 503
        health = requests.get(srv.url + "/health", timeout=5)
        assert health.status_code == 503
        assert "debug.fail_step: step 3" in health.json()["reason"]
        assert srv.metric("tessera:engine_fatal_errors_total") == 1
        assert grpc_health_status(srv) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert complete(srv, max_tokens=1).status_code == 503
    finally:
        assert srv.stop() == 0, srv.log_tail()
