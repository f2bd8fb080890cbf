"""tests/integration/serving.py: start and stop a real `tessera serve` for the integration tests, read
its /metrics, reference output from `tessera generate`, and gRPC stubs generated from the proto at
test time (never committed)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "proto"

LLM_DIR = "smollm2-135m-instruct"
EMBEDDING_DIR = "all-minilm-l6-v2"
# Served names (the OpenAI `model` field).
LLM = "smollm2"
EMBEDDING = "minilm"
API_KEY = "tessera-integration-key"
# Small on purpose: KV pool, prompt-over-context and body-size tests stay cheap.
MAX_MODEL_LEN = 1024
MAX_BODY_BYTES = 1 << 20
LISTENING = re.compile(r"tessera: listening http=\S+:(\d+) grpc=\S+:(\d+)")
# all-MiniLM-L6-v2's input limit: max_seq_length in its sentence_bert_config.json (its position table
# has 512), what SentenceTransformer.encode truncates to and so what every Tessera path uses.
EMBEDDING_LIMIT = 256
# Every word is one WordPiece token of MiniLM's vocabulary, so n words make n + 2 tokens ([CLS], [SEP]).
_HEAD_WORDS = "the quick brown fox jumps over the lazy dog".split()
_TAIL_WORDS = "stock markets fell sharply after the bank raised interest rates".split()


def over_limit_texts(tokens: int = 300) -> tuple[str, str, str]:
    """(long, head, late): `long` has `tokens` tokens with special tokens, its words about a fox up to
    the limit and about markets after it; `head` is `long` truncated to EMBEDDING_LIMIT tokens as
    HF does ([CLS] + the first limit - 2 words + [SEP]); `late` is a window of the same length at the
    end of `long`, so an embedding that kept the wrong end would match it instead."""
    head_words = [_HEAD_WORDS[i % len(_HEAD_WORDS)] for i in range(EMBEDDING_LIMIT - 2)]
    tail_words = [_TAIL_WORDS[i % len(_TAIL_WORDS)] for i in range(tokens - EMBEDDING_LIMIT)]
    words = head_words + tail_words
    return " ".join(words), " ".join(head_words), " ".join(words[len(words) - (EMBEDDING_LIMIT - 2):])


def model_dir() -> Path:
    """$TESSERA_MODEL_DIR or ~/.cache/tessera/models, as `tessera` itself resolves it."""
    env = os.environ.get("TESSERA_MODEL_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tessera" / "models"


# The backend the servers and `tessera generate` run on: TESSERA_TEST_BACKEND=cuda runs the suite on
# a GPU. TESSERA_TEST_EMBEDDING=0 serves the LLM alone (a GPU run that carries only SmolLM2).
BACKEND = os.environ.get("TESSERA_TEST_BACKEND", "cpu")
# TESSERA_TEST_TENSOR_PARALLEL=2 shards the servers' LLM over two GPUs; SmolLM2's 9 heads do not
# split, so such a run points TESSERA_MODEL_DIR at a copy padded by pad_attention_heads.py.
TENSOR_PARALLEL = int(os.environ.get("TESSERA_TEST_TENSOR_PARALLEL", "1"))
WITH_EMBEDDING = os.environ.get("TESSERA_TEST_EMBEDDING", "1") != "0"


def missing_models() -> list[str]:
    root = model_dir()
    missing = []
    if not list((root / LLM_DIR).glob("*.gguf")):
        missing.append(str(root / LLM_DIR / "*.gguf"))
    if WITH_EMBEDDING and not (root / EMBEDDING_DIR / "model.safetensors").is_file():
        missing.append(str(root / EMBEDDING_DIR / "model.safetensors"))
    return missing


def tessera_binary() -> Path:
    env = os.environ.get("TESSERA_BIN")
    if env:
        return Path(env)
    for build in ("build", "build-grpc"):
        candidate = REPO / build / "server" / "tessera"
        if candidate.is_file():
            return candidate
    raise RuntimeError("set TESSERA_BIN to the built `tessera` binary (ctest does)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TesseraServer:
    """One `tessera serve` process on OS-chosen loopback ports with SmolLM2 and/or MiniLM (CPU)."""

    def __init__(self, workdir: Path, *, api_keys: tuple[str, ...] = (API_KEY,), embedding: bool = WITH_EMBEDDING,
                 drain_timeout_s: float = 30.0, threads: int = 2, http_threads: int | None = None,
                 settings: dict | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.api_keys = api_keys
        self.embedding = embedding
        self.drain_timeout_s = drain_timeout_s
        self.threads = threads
        self.http_threads = http_threads
        # More top-level config keys, e.g. {"prefix_caching": False}. On the GPU a prompt computed in
        # one chunk and the same prompt's tail over cached blocks round differently in bf16, so a
        # greedy text can part from an earlier one at a near tie; the tests that compare outputs
        # exactly therefore run GPU servers without the prefix cache, and test_kv_reuse checks the
        # cache on the GPU with bf16 tolerances.
        self.settings = ({"prefix_caching": False} if BACKEND != "cpu" else {}) | (settings or {})
        self.cwd: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.http_port = 0
        self.grpc_port = 0
        self.log_path: Path | None = None

    # -- addresses ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_keys[0]}"} if self.api_keys else {}

    def grpc_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_keys[0]}"),) if self.api_keys else ()

    # -- lifecycle ---------------------------------------------------------------------------------
    def _config(self) -> dict:
        root = model_dir()
        models = [{"name": LLM, "path": str(root / LLM_DIR), "kind": "llm"}]
        if self.embedding:
            models.append({"name": EMBEDDING, "path": str(root / EMBEDDING_DIR), "kind": "embedding"})
        config = {
            "http": {"enabled": True, "host": "127.0.0.1", "port": self.http_port},
            "grpc": {"enabled": True, "host": "127.0.0.1", "port": self.grpc_port},
            "models": models,
            "auth": {"api_keys": list(self.api_keys), "protect_health": False, "protect_metrics": False},
            "limits": {
                "max_queue_size": 256,
                "max_batch_tokens": 2048,
                "max_running_sequences": 128,
                "max_model_len": MAX_MODEL_LEN,
                # Four sequences of max_model_len, set: unset, a GPU server would take 0.9 of the
                # free GPU memory, and test servers share one GPU.
                "kv_cache_tokens": 4 * MAX_MODEL_LEN,
                "max_body_bytes": MAX_BODY_BYTES,
                "request_timeout_s": 120.0,
                "drain_timeout_s": self.drain_timeout_s,
            },
            "backend": BACKEND,
            **({"tensor_parallel": TENSOR_PARALLEL} if TENSOR_PARALLEL > 1 else {}),
            "threads": self.threads,
            **({"http_threads": self.http_threads} if self.http_threads else {}),
            "log_level": "info",
        }
        # A mapping in settings (e.g. {"limits": {...}}) adds to that section instead of replacing it.
        for key, value in self.settings.items():
            config[key] = {**config[key], **value} if isinstance(value, dict) and isinstance(config.get(key), dict) else value
        return config

    def _command(self) -> list[str]:
        config_path = self.workdir / "server.yaml"
        config_path.write_text(json.dumps(self._config(), indent=2))  # JSON is YAML
        return [str(tessera_binary()), "serve", "--config", str(config_path)]

    def start(self, timeout_s: float = 180.0) -> "TesseraServer":
        # Port 0 for both: the OS picks free ports and the server prints them on one stdout line
        # ("tessera: listening http=HOST:PORT grpc=HOST:PORT models=..."), so nothing can race us.
        self.http_port = self.grpc_port = 0
        command = self._command()
        self.log_path = self.workdir / "server.log"
        env = dict(os.environ, TESSERA_MODEL_DIR=str(model_dir()))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd)
        if not self._wait_ready(timeout_s):
            tail = self.log_tail()
            self.kill()
            raise RuntimeError(f"tessera serve did not become ready in {timeout_s:.0f}s; its log ends:\n{tail}")
        return self

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if not self.http_port:
                match = LISTENING.search(self.log_path.read_text(errors="replace"))
                if match:
                    self.http_port, self.grpc_port = int(match.group(1)), int(match.group(2))
            if self.http_port:
                try:
                    if requests.get(self.url + "/ready", timeout=2).status_code == 200:
                        return True
                except requests.RequestException:
                    pass
            time.sleep(0.2)
        return False

    def terminate(self) -> None:
        """SIGTERM: the server drains, then exits."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def log_tail(self, lines: int = 60) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    # -- observations ------------------------------------------------------------------------------
    def metrics_text(self) -> str:
        r = requests.get(self.url + "/metrics", timeout=10)
        r.raise_for_status()
        return r.text

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` (e.g. "tessera:num_requests_running") whose labels include
        `labels`."""
        return metric_value(self.metrics_text(), name, **labels)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")



# ---- the commands README.md and docs/*.md show ------------------------------------------------------
# Tests run those commands as written (tests/docs/test_docs.py checks that each one is in some test).
# `build/server/tessera` stands for the binary under test and `python3` for this interpreter; the
# commands run in a workspace folder where the repository's configs/, bench/ and tuner/ are linked,
# so their relative paths resolve and what they write (tune-out/) stays out of the tree.
DOCUMENTED_PROGRAMS = {"build/server/tessera": lambda: str(tessera_binary()), "python3": lambda: sys.executable}


def documented_argv(command: str) -> list[str]:
    argv = shlex.split(command)
    program = DOCUMENTED_PROGRAMS.get(argv[0])
    return [program() if program else argv[0], *argv[1:]]


def documented_workspace(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name in ("configs", "bench", "tuner"):
        link = path / name
        if not link.exists():
            link.symlink_to(REPO / name)
    return path


def run_documented(command: str, workspace: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESSERA_MODEL_DIR=str(model_dir()))
    return subprocess.run(documented_argv(command), cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=timeout)


class DocumentedServer(TesseraServer):
    """A documented `tessera serve` command run in a workspace, on OS-chosen ports instead of its own."""

    def __init__(self, workdir: Path, command: str, workspace: Path):
        super().__init__(workdir, api_keys=())
        self.command = command
        self.cwd = workspace

    def _command(self) -> list[str]:
        return documented_argv(self.command) + ["--set", "http.port=0", "--set", "grpc.port=0"]


def send_documented_request(command: str, server: TesseraServer) -> requests.Response:
    """A documented `curl -s[N] URL [-H 'Key: value']... [-d BODY]` sent to `server` instead of
    127.0.0.1:8080."""
    argv = shlex.split(command)
    assert argv[0] == "curl", command
    url, headers, body = None, {}, None
    args = iter(argv[1:])
    for arg in args:
        if arg == "-H":
            key, value = next(args).split(":", 1)
            headers[key.strip()] = value.strip()
        elif arg == "-d":
            body = next(args)
        elif arg.startswith("http://127.0.0.1:8080/"):
            url = server.url + arg[len("http://127.0.0.1:8080"):]
        else:
            assert arg in ("-s", "-N", "-sN"), f"{arg!r} in {command}"
    if body is None:
        return requests.get(url, headers=headers, timeout=120)
    return requests.post(url, data=body.encode(), headers=headers, timeout=120)

def metric_value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
                found = True
    if not found:
        raise KeyError(f"{name}{labels or ''} not in /metrics")
    return total


def wait_for(predicate, timeout_s: float, interval_s: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def reference_generate(*, prompt: str | None = None, chat: str | None = None, max_tokens: int,
                       threads: int = 2) -> tuple[str, dict]:
    """Greedy text and usage line from `tessera generate` (the single-request CLI engine)."""
    args = [str(tessera_binary()), "generate", "--model", str(model_dir() / LLM_DIR), "--max-tokens",
            str(max_tokens), "--temperature", "0", "--threads", str(threads), "--backend", BACKEND]
    args += ["--prompt", prompt] if prompt is not None else ["--chat", chat]
    out = subprocess.run(args, capture_output=True, check=True, timeout=300,
                         env=dict(os.environ, TESSERA_MODEL_DIR=str(model_dir()))).stdout.decode()
    # The text, then "\n" and one JSON line of usage and timings.
    assert out.endswith("\n"), out
    body = out[:-1]
    cut = body.rfind("\n")
    return body[:cut], json.loads(body[cut + 1:])


def generate_grpc_modules(out_dir: Path):
    """Compiles proto/tessera/v1/*.proto with grpcio-tools into out_dir and imports the modules."""
    from grpc_tools import protoc  # noqa: PLC0415 (only needed here)
    import grpc_tools

    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "tessera" / "v1").glob("*.proto"))
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out_dir}",
                      f"--grpc_python_out={out_dir}", *protos])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed ({rc}) on {protos}")
    sys.path.insert(0, str(out_dir))
    import importlib

    pb2 = importlib.import_module("tessera.v1.inference_pb2")
    pb2_grpc = importlib.import_module("tessera.v1.inference_pb2_grpc")
    return pb2, pb2_grpc
