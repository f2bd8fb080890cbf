"""tests/integration/conftest.py: one `tessera serve` (SmolLM2 + MiniLM, CPU backend, an API key)
shared by the session, its clients, and gRPC stubs generated from the proto at test time.

Needs TESSERA_BIN (ctest passes it) and the models in $TESSERA_MODEL_DIR (scripts/fetch-models);
without the models every test is skipped with a message saying so."""

from __future__ import annotations

import grpc
import openai
import pytest

import serving


@pytest.fixture(scope="session", autouse=True)
def models_present():
    missing = serving.missing_models()
    if missing:
        pytest.skip("models not found: " + ", ".join(missing) + " (run scripts/fetch-models, or set TESSERA_MODEL_DIR)")


@pytest.fixture(scope="session")
def server(tmp_path_factory, models_present):
    srv = serving.TesseraServer(tmp_path_factory.mktemp("server"))
    srv.start()
    yield srv
    code = srv.stop()
    assert code == 0, f"tessera serve exited with {code}; log:\n{srv.log_tail()}"


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=serving.API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """(inference_pb2, inference_pb2_grpc) compiled from proto/ into a temp dir."""
    return serving.generate_grpc_modules(tmp_path_factory.mktemp("grpc_gen"))


@pytest.fixture(scope="session")
def channel(server):
    ch = grpc.insecure_channel(server.grpc_target)
    grpc.channel_ready_future(ch).result(timeout=30)
    yield ch
    ch.close()


@pytest.fixture(scope="session")
def stub(pb, channel):
    return pb[1].InferenceServiceStub(channel)


@pytest.fixture
def idle(server):
    """Waits until the engine has nothing running (tests that count requests or KV need a quiet
    server)."""
    serving.wait_for(lambda: server.metric("tessera:num_requests_running") == 0
                     and server.metric("tessera:num_requests_waiting") == 0, 60, what="an idle engine")
    return server
