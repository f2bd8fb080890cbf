"""tests/integration/test_documented_commands.py: the commands README.md and docs/*.md show, run as
shown (test_tune.py runs the tuning ones). Each must exit 0 and print something; a served command
must become ready, answer the documented requests, and drain on SIGTERM. GPU commands skip without
a GPU. tests/docs/test_docs.py checks that every documented command is in a test."""

from __future__ import annotations

import json
import os

import pytest

import serving

needs_gpu = pytest.mark.skipif(not os.path.exists("/dev/nvidia0"), reason="needs a CUDA GPU")
# configs/server.yaml serves MiniLM beside SmolLM2; a GPU run may carry SmolLM2 alone.
needs_minilm = pytest.mark.skipif(not serving.WITH_EMBEDDING, reason="MiniLM is not part of this run")

CPU_COMMANDS = [
    "build/server/tessera info --model smollm2-135m-instruct",
    "build/server/tessera tokenize --model smollm2-135m-instruct --lines texts.jsonl",
    'build/server/tessera generate --model smollm2-135m-instruct --chat "What is 2 + 2?" --temperature 0 '
    "--max-tokens 16",
    'build/server/tessera generate --model smollm2-135m-instruct --prompt "The capital of France is" --max-tokens 32',
    "build/server/tessera info --model smollm2-135m-instruct --backend cpu --cpu-weights f32",
    'build/server/tessera generate --model smollm2-135m-instruct --prompt "The capital of France is" --max-tokens 32 '
    "--cpu-activation-bits 8",
    "python3 tuner/calibrate_int4.py --help",
]
MINILM_COMMANDS = [
    'build/server/tessera tokenize --model all-minilm-l6-v2 --text "Hello, world!" --add-special',
    'build/server/tessera embed --model all-minilm-l6-v2 "First text." "Second text."',
]
GPU_COMMANDS = [
    'build/server/tessera generate --model smollm2-135m-instruct --prompt "The capital of France is" --max-tokens 32 '
    "--backend cuda --cuda-weights int4_g128",
    "build/server/tessera info --model smollm2-135m-instruct --backend cuda --cuda-weights int8 "
    "--cuda-kv-dtype fp8_e4m3",
]

SERVE = "build/server/tessera serve --config configs/server.yaml"
CPU_SERVE_VARIANTS = ["build/server/tessera serve --config configs/server.yaml --set cpu_activation_bits=8"]
GPU_SERVE_VARIANTS = [
    "build/server/tessera serve --config configs/server.yaml --cuda-weights fp8_e4m3 --cuda-kv-dtype fp8_e4m3",
]
CHAT_REQUEST = (
    "curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' "
    """-d '{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is the capital of """
    """France?"}], "max_tokens": 32, "temperature": 0}'""")
STREAM_REQUEST = (
    "curl -sN http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' "
    """-d '{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Say hello."}], """
    """"max_tokens": 8, "stream": true}'""")
EMBED_REQUEST = (
    "curl -s http://127.0.0.1:8080/v1/embeddings -H 'Content-Type: application/json' "
    """-d '{"model": "all-minilm-l6-v2", "input": "Tessera serves LLMs."}'""")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    path = serving.documented_workspace(tmp_path_factory.mktemp("documented"))
    (path / "texts.jsonl").write_text('"first line"\n"two\\nlines inside one text"\n')
    return path


def marked(commands: list[str], mark) -> list:
    return [pytest.param(command, marks=mark) for command in commands]


@pytest.mark.parametrize("command",
                         CPU_COMMANDS + marked(MINILM_COMMANDS, needs_minilm) + marked(GPU_COMMANDS, needs_gpu))
def test_command(command, workspace):
    proc = serving.run_documented(command, workspace)
    assert proc.returncode == 0, f"{command}\nexited {proc.returncode}:\n{proc.stderr}"
    assert proc.stdout.strip(), f"{command} printed nothing"


def check_chat(server) -> None:
    r = serving.send_documented_request(CHAT_REQUEST, server)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]


@needs_minilm
def test_serve_answers_the_documented_requests(workspace, tmp_path):
    srv = serving.DocumentedServer(tmp_path / "srv", SERVE, workspace).start()
    try:
        check_chat(srv)
        stream = serving.send_documented_request(STREAM_REQUEST, srv)
        assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]"), stream.text
        embedding = serving.send_documented_request(EMBED_REQUEST, srv)
        assert embedding.status_code == 200, embedding.text
        assert len(json.loads(embedding.text)["data"][0]["embedding"]) == 384
    finally:
        assert srv.stop() == 0, srv.log_tail()


@needs_minilm
@pytest.mark.parametrize("command", CPU_SERVE_VARIANTS + marked(GPU_SERVE_VARIANTS, needs_gpu))
def test_serve_variant(command, workspace, tmp_path):
    srv = serving.DocumentedServer(tmp_path / "srv", command, workspace).start()
    try:
        check_chat(srv)
    finally:
        assert srv.stop() == 0, srv.log_tail()
