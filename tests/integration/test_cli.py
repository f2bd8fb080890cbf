"""tests/integration/test_cli.py: the `tessera` CLI contract on the real models:
info numbers, tokenize's JSON lines, generate's answer and usage line, embed's ranking, errors, and
the zero-head padding that lets the suite run at tensor_parallel 2."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import serving


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESSERA_MODEL_DIR=str(serving.model_dir()))
    proc = subprocess.run([str(serving.tessera_binary()), *args], capture_output=True, text=True, env=env,
                          timeout=300)
    if check:
        assert proc.returncode == 0, f"tessera {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
    return proc


@pytest.mark.parametrize("model, expected", [
    (serving.LLM_DIR, dict(architecture="llama", num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3,
                           head_dim=64, vocab_size=49152, context_length=8192, rope_theta=100000.0)),
    (serving.EMBEDDING_DIR, dict(architecture="bert", num_layers=6, hidden_size=384, num_heads=12,
                                 vocab_size=30522, context_length=512)),
])
def test_info_reports_the_model(model, expected):
    info = json.loads(run_cli("info", "--model", model, "--json").stdout)
    assert {k: info[k] for k in expected} == expected
    assert info["tensors"]["count"] == sum(info["tensors"]["by_dtype"].values())


def test_info_chat_template_and_tensor_dtypes():
    info = json.loads(run_cli("info", "--model", serving.LLM_DIR, "--json").stdout)
    assert info["chat_template"]["name"] == "chatml"
    assert info["tensors"]["by_dtype"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}


def test_unknown_model_is_a_clear_error():
    proc = run_cli("info", "--model", "no-such-model", check=False)
    assert proc.returncode == 1
    assert "model 'no-such-model' not found" in proc.stderr and "available:" in proc.stderr


def test_tokenize_text_and_lines(tmp_path):
    line = json.loads(run_cli("tokenize", "--model", serving.EMBEDDING_DIR, "--text", "Hello, world!",
                              "--add-special").stdout)
    assert line["tokens"] == ["[CLS]", "hello", ",", "world", "!", "[SEP]"]
    assert len(line["ids"]) == len(line["tokens"]) and line["ids"][0] == 101 and line["ids"][-1] == 102

    texts = ["first line", "two\nlines inside one text", "<|im_start|>user"]
    src = tmp_path / "texts.jsonl"
    src.write_text("".join(json.dumps(t) + "\n" for t in texts))
    out = [json.loads(l) for l in run_cli("tokenize", "--model", serving.LLM_DIR, "--lines", str(src)).stdout.splitlines()]
    assert len(out) == len(texts)
    assert out[2]["tokens"][0] == "<|im_start|>"  # special tokens are split out first


def test_generate_answers_and_reports_usage():
    # A question whose greedy answer holds with 8-bit activations as with fp32 ones: the CPU backend
    # quantizes activations as llama.cpp does, and on "What is the capital of France?" both answer
    # "L'Étoile, la ..." where fp32 arithmetic says Paris (a near-tie for a 135M model).
    proc = run_cli("generate", "--model", serving.LLM_DIR, "--chat", "What is 2 + 2?",
                   "--temperature", "0", "--max-tokens", "16")
    lines = proc.stdout.rstrip("\n").split("\n")
    usage = json.loads(lines[-1])
    assert "4" in "\n".join(lines[:-1])
    assert usage["usage"]["prompt_tokens"] > 0 and 0 < usage["usage"]["completion_tokens"] <= 16
    assert usage["timings"]["ttft_ms"] > 0


def test_generate_rejects_a_bad_attention_policy():
    proc = run_cli("generate", "--model", serving.LLM_DIR, "--prompt", "Hi", "--max-tokens", "1",
                   "--attention", '{"sliding_window": {"window": 0}}', check=False)
    assert proc.returncode == 1 and "attention.sliding_window.window" in proc.stderr


def test_embed_ranks_a_paraphrase_above_an_unrelated_sentence():
    texts = ["How do I reset my password?", "I forgot my password and need to change it.",
             "The stock market fell sharply on Monday."]
    vecs = [json.loads(l)["embedding"] for l in run_cli("embed", "--model", serving.EMBEDDING_DIR, *texts).stdout.splitlines()]
    assert len(vecs) == 3 and all(len(v) == 384 for v in vecs)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-4 for v in vecs)  # L2-normalised
    cos = lambda a, b: sum(x * y for x, y in zip(a, b))
    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2]) + 0.3


def test_embed_truncates_to_max_seq_length_unless_told_not_to():
    long, head, late = serving.over_limit_texts(300)
    vecs = [json.loads(l)["embedding"]
            for l in run_cli("embed", "--model", serving.EMBEDDING_DIR, long, head, late).stdout.splitlines()]
    cos = lambda a, b: sum(x * y for x, y in zip(a, b))  # L2-normalised
    assert cos(vecs[0], vecs[1]) > 0.9999  # 256 tokens, as sentence-transformers embeds it
    assert cos(vecs[0], vecs[2]) < 0.95    # the end was cut, not the start
    proc = run_cli("embed", "--model", serving.EMBEDDING_DIR, "--no-truncate", "short", long, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert ("input[1] has 300 tokens, over this model's limit of %d (max_seq_length)" % serving.EMBEDDING_LIMIT
            in proc.stderr), proc.stderr
    assert "--no-truncate" in proc.stderr
    assert len(run_cli("embed", "--model", serving.EMBEDDING_DIR, "--no-truncate", head).stdout.splitlines()) == 1


def test_info_on_the_cpu_backend_reports_kv_blocks():
    info = json.loads(run_cli("info", "--model", serving.LLM_DIR, "--json", "--backend", "cpu",
                              "--kv-cache-tokens", "1000").stdout)
    assert info["backend"]["kv_blocks"] == 63  # 1,000 tokens in blocks of 16
    assert info["backend"]["description"].startswith("cpu")
    # The CPU backend keeps the GGUF's formats in memory: the Q8_0 embedding (also the
    # tied lm_head) and the Q4_1 projections stay quantized; norms are fp32.
    kept = {g["group"]: g["format"] for g in info["backend"]["weights_in_memory"]}
    assert kept["model.embed_tokens.weight"] == "q8_0", kept
    assert kept["model.layers.{L}.qkv"] == "q4_1", kept
    assert kept["model.norm.weight"] == "f32", kept


def test_cuda_without_a_gpu_is_a_clear_error_at_start():
    """On a machine with no GPU (CI), asking for cuda stops with a message, not a crash."""
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("a GPU is present")
    for args in (["generate", "--model", serving.LLM_DIR, "--prompt", "Hi", "--max-tokens", "2", "--backend", "cuda"],
                 ["serve", "--model", serving.LLM_DIR, "--backend", "cuda"]):
        proc = run_cli(*args, check=False)
        assert proc.returncode == 1, proc.stderr
        assert "no CUDA GPU is visible" in proc.stderr or "not built into this binary" in proc.stderr, proc.stderr


def test_tensor_parallel_on_fewer_gpus_is_a_clear_error_at_start():
    """--tensor-parallel 2 on a machine with fewer than two GPUs stops at start, naming the GPUs."""
    if os.path.exists("/dev/nvidia1"):
        pytest.skip("two GPUs are present")
    for args in (["generate", "--model", serving.LLM_DIR, "--prompt", "Hi", "--max-tokens", "2", "--tensor-parallel", "2"],
                 ["info", "--model", serving.LLM_DIR, "--tensor-parallel", "2"],
                 ["serve", "--model", serving.LLM_DIR, "--tensor-parallel", "2"]):
        proc = run_cli(*args, check=False)
        assert proc.returncode == 1, proc.stderr
        assert "tensor_parallel 2" in proc.stderr, proc.stderr
        assert "GPUs" in proc.stderr or "no CUDA backend" in proc.stderr, proc.stderr


def write_shape(folder, vocab_size: int):
    """A Llama shape folder: a config.json and nothing else (no weights, no tokenizer)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size,
                  max_position_embeddings=1024, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_serve_takes_a_shape_folder_with_random_weights_and_another_models_tokenizer(tmp_path):
    """A config.json alone serves with --random-weights and --tokenizer (how a 70B shape is timed)."""
    import requests

    shape = write_shape(tmp_path / "shape", vocab_size=49152)  # SmolLM2's vocabulary
    tokenizer = str(serving.model_dir() / serving.LLM_DIR)
    model = {"name": "shape", "path": str(shape), "random_weights": True, "tokenizer": tokenizer}
    server = serving.TesseraServer(tmp_path / "server", embedding=False, settings={"models": [model]}).start()
    try:
        r = requests.post(f"{server.url}/v1/completions", headers=server.auth_headers(), timeout=60,
                          json={"model": "shape", "prompt": "Hello there", "max_tokens": 8, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
        assert "random weights" in server.log_tail()
    finally:
        server.stop()


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_by_name(tmp_path):
    shape = write_shape(tmp_path / "shape", vocab_size=1000)
    proc = run_cli("serve", "--model", str(shape), "--random-weights", "--tokenizer", serving.LLM_DIR, "--backend", "cpu",
                   check=False)
    assert proc.returncode == 1, proc.stderr
    assert "models.0.tokenizer" in proc.stderr and "49152" in proc.stderr, proc.stderr


def test_attention_padded_with_zero_heads_generates_the_same_text(tmp_path):
    """pad_attention_heads.py, which lets the suite run at tensor_parallel 2, leaves SmolLM2's
    greedy text as it was: zero heads add nothing."""
    source = next((serving.model_dir() / serving.LLM_DIR).glob("*.gguf"))
    padded = tmp_path / "padded.gguf"
    subprocess.run([sys.executable, str(Path(__file__).parent / "pad_attention_heads.py"), str(source), str(padded),
                    "--ranks", "2"], check=True, capture_output=True, timeout=120)
    info = json.loads(run_cli("info", "--model", str(padded), "--json").stdout)
    assert (info["num_heads"], info["num_kv_heads"], info["head_dim"]) == (12, 4, 64)
    texts = []
    for model in (str(source), str(padded)):
        out = run_cli("generate", "--model", model, "--prompt", "The capital of France is", "--temperature", "0",
                      "--max-tokens", "24").stdout
        # The text alone: not the usage line, whose timings differ, nor the log lines.
        lines = out.rstrip("\n").split("\n")[:-1]
        texts.append("\n".join(line for line in lines if not line.startswith("[20")))
    assert texts[0] == texts[1] and texts[0].strip()
