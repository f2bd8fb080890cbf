"""tests/integration/test_tune.py: `tessera tune` end to end on the CPU: the CI space
(configs/tune/cpu-ci.yaml) on SmolLM2 in under 3 minutes, its outputs, resuming, and a server that
loads the profile and visibly runs what it says (weight format and fusions), or refuses a profile
made for another model unless forced. The tune, info and serve commands are the ones docs/tuning.md
shows, run as shown (the GPU one skips without a GPU)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

import serving

SPACE = serving.REPO / "configs" / "tune" / "cpu-ci.yaml"
CI_BUDGET_S = 180.0
TUNE = "build/server/tessera tune --model smollm2-135m-instruct --space configs/tune/cpu-ci.yaml --out tune-out"
INFO_PROFILE = "build/server/tessera info --profile tune-out/profile.yaml"
SERVE_PROFILE = ("build/server/tessera serve --config configs/server.yaml --backend cpu "
                 "--profile tune-out/profile.yaml")
GPU_TUNE = ("build/server/tessera tune --model smollm2-135m-instruct --space configs/tune/gpu-smollm2-bf16.yaml "
            "--out tune-bf16")


def llm_path() -> Path:
    return serving.model_dir() / serving.LLM_DIR


def gguf_sha256() -> str:
    # The model file, as locate_model finds it: an int4_g128 calibration sidecar beside it is no model.
    (gguf,) = [p for p in llm_path().glob("*.gguf") if not p.name.lower().endswith(".int4_g128.gguf")]
    return hashlib.sha256(gguf.read_bytes()).hexdigest()


def tessera(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(serving.tessera_binary()), *args], capture_output=True, text=True, timeout=timeout)


def run_tune(workspace: Path) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = serving.run_documented(TUNE, workspace, timeout=600)
    return proc, time.monotonic() - t0


def info_json(*args: str) -> dict:
    proc = tessera("info", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return serving.documented_workspace(tmp_path_factory.mktemp("tune"))


@pytest.fixture(scope="module")
def tuned(workspace):
    """The CI tune, run once: (out dir, its process, wall seconds)."""
    proc, wall = run_tune(workspace)
    assert proc.returncode == 0, f"tessera tune failed:\n{proc.stdout}\n{proc.stderr}"
    return workspace / "tune-out", proc, wall


def variant(tuned_dir: Path, tmp: Path, name: str, **replace: str) -> Path:
    """The tuned profile with some lines replaced (key: 'old line' -> 'new line')."""
    text = (tuned_dir / "profile.yaml").read_text()
    for old_new in replace.values():
        old, new = old_new.split("=>")
        assert re.search(old, text, flags=re.M), f"{old!r} not in the profile:\n{text}"
        text = re.sub(old, new, text, count=1, flags=re.M)
    path = tmp / name
    path.write_text(text)
    return path


def test_ci_tune_runs_in_budget_and_writes_every_output(tuned):
    out, proc, wall = tuned
    assert wall < CI_BUDGET_S, f"the CI tune took {wall:.0f}s (budget {CI_BUDGET_S:.0f}s)"
    for name in ("profile.yaml", "report.html", "table.md", "candidates.jsonl"):
        assert (out / name).is_file(), name
    records = [json.loads(line) for line in (out / "candidates.jsonl").read_text().splitlines() if line]
    assert len(records) == 12  # 3 weight formats x qkv x activation bits
    assert {r["candidate"]["activation_bits"] for r in records} == {8, 16}
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    for r in records:
        assert [t["size"] for t in r["prefill"]] == [128] and [t["size"] for t in r["decode"]] == [1, 8]
        for t in r["prefill"] + r["decode"]:
            assert 0 < t["min_ms"] <= t["median_ms"] <= t["max_ms"]
        assert 5 < r["perplexity"] < 100 and r["kl"] >= 0
        assert r["weight_bytes"] > 50 << 20 and r["kv_bytes"] == 2 * 30 * 2048 * 3 * 64 * 4
    by_format = {r["candidate"]["weight_format"]: r for r in records}
    # Q4_0 requantized from the file's Q4_1 loses quality; Q8_0 is the most precise and the reference.
    assert by_format["q4_0"]["perplexity"] > by_format["q8_0"]["perplexity"]
    assert by_format["q4_0"]["weight_bytes"] < by_format["gguf"]["weight_bytes"] < by_format["q8_0"]["weight_bytes"]
    assert "chosen:" in proc.stdout and "| **chosen** |" in proc.stdout
    assert re.search(r"tune \[[#.]+\] \d+/12\s+ETA", proc.stderr), "progress with an ETA on stderr"
    html = (out / "report.html").read_text()
    assert "<svg" in html and "chosen:" in html and html.count("<tr") == 13
    # Every axis a candidate differs by has its column, so no two rows read the same.
    assert "<th>KV cache</th>" in html and "<th>decode split &ge;</th>" in html
    # Self-contained: no scripts, stylesheets or images fetched from anywhere.
    assert not re.search(r"<script|<link|<img|src=|url\(", html)


def test_profile_names_the_model_device_commit_and_choice(tuned, workspace):
    out, _, _ = tuned
    p = info_json("--profile", str(out / "profile.yaml"))
    assert p["model"]["sha256"] == gguf_sha256()
    assert p["model"]["architecture"] == "llama"
    assert p["device"].startswith("cpu: ") and p["backend"] == "cpu"
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", p["tessera"]["commit"])
    assert p["policy"] == "fastest_decode_within_ppl_pct: 2"
    choice = p["choice"]
    assert choice["weight_format"] in ("gguf", "q8_0", "q4_0")
    assert choice["fusions"]["rope_kv_write"] == "separate" and choice["cuda_graphs"] is False
    m = p["measured"]
    assert set(m["decode_ms"]) == {"batch_1", "batch_8"} and set(m["prefill_ms"]) == {"tokens_128"}
    assert m["perplexity_delta_pct"] <= 2.0  # the policy's budget
    text = serving.run_documented(INFO_PROFILE, workspace)
    assert text.returncode == 0 and "weight format:" in text.stdout and "fusions:" in text.stdout


def test_a_second_run_resumes_without_measuring(tuned, workspace):
    _, first, first_wall = tuned
    proc, wall = run_tune(workspace)
    assert proc.returncode == 0, proc.stderr
    assert "(0 measured now, 12 resumed)" in proc.stdout
    assert wall < first_wall
    chosen = re.search(r"^chosen: (\S+)", first.stdout, flags=re.M).group(1)
    assert f"chosen: {chosen}" in proc.stdout


@pytest.mark.skipif(not os.path.exists("/dev/nvidia0"), reason="needs a CUDA GPU")
def test_the_gpu_tune_writes_a_cuda_profile(workspace):
    proc = serving.run_documented(GPU_TUNE, workspace, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert info_json("--profile", str(workspace / "tune-bf16" / "profile.yaml"))["backend"] == "cuda"


def test_bad_space_is_refused_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPACE.read_text().replace("  qkv: [fused, separate]", "  qkv: [fused, separate]\n  qkv_bias: [fused]"))
    proc = tessera("tune", "--model", str(llm_path()), "--space", str(bad), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1 and "unknown key 'fusions.qkv_bias'" in proc.stderr, proc.stderr
    bad.write_text(SPACE.read_text().replace("[gguf, q8_0, q4_0]", "[gguf, fp8_e4m3]"))
    proc = tessera("tune", "--model", str(llm_path()), "--space", str(bad), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1 and "weight_format[1]: fp8_e4m3 is a GPU weight format" in proc.stderr, proc.stderr


@pytest.mark.skipif(not serving.WITH_EMBEDDING, reason="configs/server.yaml serves MiniLM, not part of this run")
def test_server_applies_the_tuned_profile(tuned, workspace, tmp_path):
    out, _, _ = tuned
    profile = info_json("--profile", str(out / "profile.yaml"))
    srv = serving.DocumentedServer(tmp_path / "srv", SERVE_PROFILE, workspace).start()
    model = "smollm2-135m-instruct"  # as configs/server.yaml names it
    try:
        assert srv.metric("tessera:profile_info", weight_format=profile["choice"]["weight_format"]) == 1.0
        assert srv.metric("tessera:profile_info", model_sha256=gguf_sha256()[:16], model=model) == 1.0
        r = requests.post(srv.url + "/v1/completions", timeout=60,
                          json={"model": model, "prompt": "The capital of France is", "max_tokens": 4,
                                "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"]
        log = srv.log_path.read_text()
        assert f"runs weight format {profile['choice']['weight_format']}" in log
    finally:
        assert srv.stop() == 0


def test_a_profile_changes_what_the_server_runs(tuned, tmp_path):
    """A profile choosing Q8_0 with separate q/k/v projections: the loaded model keeps Q8_0 weights and
    separate projections (the file has Q4_1 and the default graph fuses QKV), and the server says so."""
    out, _, _ = tuned
    q8 = variant(out, tmp_path, "q8-separate.yaml", fmt=r"^  weight_format: \S+$=>  weight_format: q8_0",
                 arn=r"^    add_rms_norm: \S+$=>    add_rms_norm: fused", qkv=r"^    qkv: \S+$=>    qkv: separate",
                 gate_up=r"^    gate_up: \S+$=>    gate_up: fused")
    plain = info_json("--model", str(llm_path()), "--backend", "cpu")
    tuned_q8 = info_json("--model", str(llm_path()), "--backend", "cpu", "--profile", str(q8))
    groups = lambda info: {g["group"]: g["format"] for g in info["backend"]["weights_in_memory"]}
    assert groups(plain)["model.layers.{L}.qkv"] == "q4_1"
    assert "model.layers.{L}.qkv" not in groups(tuned_q8)
    assert groups(tuned_q8)["model.layers.{L}.self_attn.q_proj.weight"] == "q8_0"
    assert groups(tuned_q8)["model.layers.{L}.gate_up"] == "q8_0"
    assert tuned_q8["backend"]["graph"] == "add_rms_norm=fused qkv=separate gate_up=fused"
    assert plain["backend"]["graph"] == "add_rms_norm=fused qkv=fused gate_up=fused"

    srv = serving.TesseraServer(tmp_path / "srv", embedding=False, settings={"profile": str(q8)})
    srv.start()
    try:
        assert srv.metric("tessera:profile_info", weight_format="q8_0",
                          fusions="add_rms_norm=fused,qkv=separate,gate_up=fused") == 1.0
        r = requests.post(srv.url + "/v1/completions", headers=srv.auth_headers(), timeout=60,
                          json={"model": serving.LLM, "prompt": "The capital of France is", "max_tokens": 4,
                                "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"]
        log = srv.log_path.read_text()
        assert "smollm2 runs weight format q8_0, add_rms_norm=fused qkv=separate gate_up=fused" in log
        serving_line = next(line for line in log.splitlines() if "serving smollm2" in line)
        assert "q8_0" in serving_line and "q4_1" not in serving_line, serving_line
    finally:
        assert srv.stop() == 0


def test_a_profile_for_another_model_is_refused_unless_forced(tuned, tmp_path):
    out, _, _ = tuned
    other = variant(out, tmp_path, "other.yaml", sha=r"^  sha256: [0-9a-f]{64}$=>  sha256: " + "0" * 64)
    proc = tessera("info", "--model", str(llm_path()), "--profile", str(other))
    assert proc.returncode == 1
    assert "does not fit: it was tuned for model" in proc.stderr and "--force" in proc.stderr, proc.stderr
    forced = tessera("info", "--model", str(llm_path()), "--profile", str(other), "--force")
    assert forced.returncode == 0 and "forced:" in forced.stdout, forced.stderr

    srv = serving.TesseraServer(tmp_path / "srv", embedding=False, settings={"profile": str(other)})
    with pytest.raises(RuntimeError):
        srv.start(timeout_s=60)
    assert "does not fit" in srv.log_path.read_text()


RANDOM_SPACE = """\
backend: cpu
context: 1024
weight_format: [f32, q8_0]
kv_dtype: [f32]
measure:
  prefill_tokens: [64]
  decode_batch: [1, 4]
  decode_context: 32
  warmup: 1
  repeats: 3
policy:
  fastest_decode_within_ppl_pct: 1
"""


def test_random_weights_measure_latency_and_memory_of_a_shape(tmp_path):
    """--random-weights on a folder with only a config.json (the shipped 7B one, shrunk to run here):
    latency and memory measured, quality null in the records and n/a in the table, report and
    profile, the fastest chosen."""
    config = json.loads((serving.REPO / "configs" / "tune" / "llama2-7b-shape" / "config.json").read_text())
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=1000)
    shape = tmp_path / "shape"
    shape.mkdir()
    (shape / "config.json").write_text(json.dumps(config))
    space = tmp_path / "space.yaml"
    space.write_text(RANDOM_SPACE)
    out = tmp_path / "out"
    args = ("tune", "--model", str(shape), "--space", str(space), "--out", str(out), "--random-weights", "--seed", "3")
    proc = tessera(*args)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "random bf16 weights (seed 3)" in proc.stderr
    records = [json.loads(line) for line in (out / "candidates.jsonl").read_text().splitlines() if line]
    assert len(records) == 2 and all("error" not in r for r in records), records
    for r in records:
        assert r["perplexity"] is None and r["kl"] is None
        assert [t["size"] for t in r["decode"]] == [1, 4] and all(t["median_ms"] > 0 for t in r["decode"])
        assert r["kv_bytes"] == 2 * 2 * 1024 * 256 * 4  # layers x context x kv width x f32
    by_format = {r["candidate"]["weight_format"]: r for r in records}
    assert by_format["q8_0"]["weight_bytes"] < by_format["f32"]["weight_bytes"]
    fastest = min(records, key=lambda r: r["decode"][0]["median_ms"])
    assert f"chosen: {fastest['key']}" in proc.stdout
    assert "quality not measurable (random weights)" in proc.stdout
    for name in ("table.md", "report.html"):
        assert "n/a (random weights)" in (out / name).read_text(), name
    p = info_json("--profile", str(out / "profile.yaml"))
    assert p["measured"]["quality"] == "n/a (random weights)" and "perplexity" not in p["measured"]
    assert re.fullmatch(r"[0-9a-f]{64}", p["model"]["sha256"])
    # Resumed as usual; another seed is other weights, so nothing is reused.
    again = tessera(*args)
    assert again.returncode == 0 and "(0 measured now, 2 resumed)" in again.stdout, again.stderr
    other = tessera(*args[:-1], "4")
    assert other.returncode == 0 and "(2 measured now, 0 resumed)" in other.stdout, other.stderr
    # --seed means nothing without --random-weights.
    assert tessera("tune", "--model", str(shape), "--space", str(space), "--out", str(out), "--seed", "3").returncode != 0


CALIBRATE = serving.REPO / "tuner" / "calibrate_int4.py"


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps: must be at least 1, got 0"),
    (["--lr", "0"], "--lr: must be positive, got 0.0"),
    # The tuner scores the first 4,096 * 8 + 4,096 characters of wiki.utf8: never train on them.
    (["--skip-chars", "1000"], "--skip-chars: 1000 would train on the tuner's held-out text (its first 36864 chars)"),
    (["--skip-chars", "100000000"], "--skip-chars: 100000000 is past the end of wiki.utf8"),
])
def test_calibrate_int4_refuses_bad_options_naming_them(args, message):
    """tuner/calibrate_int4.py checks its inputs before it needs torch or a GPU, so these hold here."""
    proc = subprocess.run([sys.executable, str(CALIBRATE), "--model", str(llm_path()), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_calibrate_int4_refuses_a_folder_without_one_gguf(tmp_path):
    proc = subprocess.run([sys.executable, str(CALIBRATE), "--model", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--model:" in proc.stderr and "(found 0)" in proc.stderr, proc.stderr
