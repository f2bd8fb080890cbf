"""A real Prometheus (Debian package `prometheus`) on loopback scrapes /metrics every second; PromQL
through its HTTP API returns the requests this test made; `promtool check metrics` passes on the
scraped text."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import requests

import serving

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
REQUESTS = 5


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus")
    port = serving.free_port()
    config = workdir / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: tessera
    scrape_interval: 1s
    scrape_timeout: 1s
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:{server.http_port}"]
""")
    log = open(workdir / "prometheus.log", "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def ready():
            assert proc.poll() is None, (workdir / "prometheus.log").read_text()
            try:
                return requests.get(base + "/-/ready", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        serving.wait_for(ready, 60, 0.2, "Prometheus ready")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def query(base: str, promql: str) -> float | None:
    r = requests.get(base + "/api/v1/query", params={"query": promql}, timeout=10)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_the_request_count(idle, prometheus, client):
    server = idle
    serving.wait_for(lambda: query(prometheus, 'up{job="tessera"}') == 1, 30, 0.5, "a successful scrape")
    success = "sum(tessera:request_success_total)"
    e2e_count = "sum(tessera:e2e_request_latency_seconds_count)"
    # Prometheus has caught up with the idle server: its value equals /metrics now.
    direct = server.metric("tessera:request_success_total")
    serving.wait_for(lambda: query(prometheus, success) == direct, 15, 0.5, "Prometheus to catch up")
    before = query(prometheus, success)
    before_e2e = query(prometheus, e2e_count)

    for i in range(REQUESTS):
        r = client.completions.create(model=serving.LLM, prompt=f"Count to {i + 3}:", max_tokens=2, temperature=0)
        assert r.usage.completion_tokens >= 1

    serving.wait_for(lambda: query(prometheus, success) == before + REQUESTS, 20, 0.5,
                     f"PromQL {success} to rise by {REQUESTS}")
    assert query(prometheus, e2e_count) == before_e2e + REQUESTS
    assert query(prometheus, "sum(increase(tessera:request_success_total[1m])) > 0") is not None
    assert server.metric("tessera:request_success_total") == before + REQUESTS
    # The gauges the endpoint picker reads are there.
    for name in ("tessera:num_requests_running", "tessera:num_requests_waiting", "tessera:kv_cache_usage_perc"):
        assert query(prometheus, name) is not None, name


def test_promtool_check_metrics_passes(server, client):
    # With samples in every histogram, after traffic of each kind.
    client.completions.create(model=serving.LLM, prompt="Hi", max_tokens=2, temperature=0)
    client.embeddings.create(model=serving.EMBEDDING, input=["hi"])
    text = server.metrics_text()
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    problems = [line for line in (check.stdout + check.stderr).decode().splitlines() if line.strip()]
    # Exit 1 is a format error; exit 3 lists lint problems. Tessera keeps vLLM's names under the
    # prefix `tessera:` (dashboards and the Gateway API endpoint picker match them), and promtool's
    # linter flags every name with a colon, so that one rule is waived; any other problem fails.
    colon_rule = "metric names should not contain ':'"
    assert check.returncode in (0, 3), problems
    other = [p for p in problems if not p.endswith(colon_rule)]
    assert not other, other
    assert check.returncode == 0 or problems, "lint exit without problems listed"
    for name in ("tessera:num_requests_running", "tessera:num_requests_waiting", "tessera:kv_cache_usage_perc",
                 "tessera:time_to_first_token_seconds", "tessera:inter_token_latency_seconds",
                 "tessera:e2e_request_latency_seconds", "tessera:request_queue_time_seconds",
                 "tessera:request_prompt_tokens", "tessera:request_generation_tokens",
                 "tessera:prompt_tokens_total", "tessera:generation_tokens_total",
                 "tessera:request_success_total", "tessera:num_preemptions_total"):
        assert f"# TYPE {name} " in text, f"{name} missing from /metrics"
    assert 'finished_reason="length"' in text
