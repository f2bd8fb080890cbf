#!/usr/bin/env python3
"""bench/cpu_idle_rss.py: resident memory of `tessera serve` on the CPU backend with SmolLM2 alone
(the bar it is held to: RSS <= 1.2 x the GGUF file + the KV cache), idle after load and again after
requests have written every block of its KV cache.

Starts the server from configs/server.yaml with only the SmolLM2 model, kv_cache_tokens 1024
(46 MB of fp32 KV) and free ports, waits for its "listening" line and --settle seconds, then reads
/proc/PID/smaps: total RSS and where it lies (the heap, other anonymous memory, thread stacks,
mapped files). Then it sends distinct completions (prompts of ~240 tokens, so the prefix cache keeps
each one's blocks and later requests take fresh ones) until more than the cache's tokens have been
written, waits --settle seconds more (the engine hands back its step scratch after a second idle), and
reads RSS again. One JSON line to stdout and to --out.

  python3 bench/cpu_idle_rss.py --tessera build-cpu/server/tessera
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = Path(os.environ.get("TESSERA_MODEL_DIR", Path.home() / ".cache/tessera/models"))
GGUF = MODEL_DIR / "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
KV_TOKENS = 1024
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # layers x (K, V) x KV heads x head dim x fp32


def config_text() -> str:
    text = (REPO / "configs/server.yaml").read_text()
    start, end = text.index("  - name: all-minilm-l6-v2"), text.index("auth:")
    text = text[:start] + "\n" + text[end:]
    text = text.replace("limits:\n", f"limits:\n  kv_cache_tokens: {KV_TOKENS}\n", 1)
    return re.sub(r"port: \d+", "port: 0", text)


def fill_kv_cache(port: int) -> int:
    """Distinct completions until more than KV_TOKENS tokens went through the cache; returns them."""
    words = "The quick brown fox jumps over the lazy dog while the curious cat watches from the sill. "
    written, i = 0, 0
    while written <= KV_TOKENS + 256:
        body = json.dumps({"model": "smollm2-135m-instruct", "prompt": f"{i} " + words * 12, "max_tokens": 16,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            written += json.loads(response.read())["usage"]["total_tokens"]
        i += 1
    return written


def smaps(pid: int) -> dict:
    parts = {"heap": 0, "anon": 0, "stacks": 0, "files": 0}
    kind = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$", line)
        if m:
            size, name = int(m.group(2), 16) - int(m.group(1), 16), m.group(3)
            kind = ("heap" if name == "[heap]" else "files" if name.startswith("/") else
                    "stacks" if name == "" and size == 8 << 20 else "anon")
        elif line.startswith("Rss:") and kind is not None:
            parts[kind] += int(line.split()[1]) * 1024
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tessera", default=str(REPO / "build-cpu/server/tessera"))
    ap.add_argument("--settle", type=float, default=3.0, help="seconds idle after listening")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(REPO / "bench/results/cpu_idle_rss.jsonl"))
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config_text())
    proc = subprocess.Popen([args.tessera, "serve", "--config", f.name, "--set", "backend=cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TESSERA_MODEL_DIR": str(MODEL_DIR)})
    try:
        port = 0
        for line in proc.stdout:
            if line.startswith("tessera: listening"):
                port = int(re.search(r"http=[^:]+:(\d+)", line).group(1))
                break
        time.sleep(args.settle)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
        threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
        parts = smaps(proc.pid)
        kv_tokens_written = fill_kv_cache(port)
        time.sleep(args.settle)
        rss_after = int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{proc.pid}/status").read_text()).group(1)) * 1024
        parts_after = smaps(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        os.unlink(f.name)
    gguf, kv = GGUF.stat().st_size, KV_TOKENS * KV_BYTES_PER_TOKEN
    bar = 1.2 * gguf + kv
    line = {"bench": "cpu_idle_rss", "model": GGUF.name, "rss_mb": round(rss / 1e6, 1),
            "bar_mb": round(bar / 1e6, 1), "ratio_to_bar": round(rss / bar, 3),
            "gguf_mb": round(gguf / 1e6, 1), "kv_cache_mb": round(kv / 1e6, 1), "threads": threads,
            "rss_parts_mb": {k: round(v / 1e6, 1) for k, v in parts.items()},
            "rss_after_kv_mb": round(rss_after / 1e6, 1), "after_kv_ratio_to_bar": round(rss_after / bar, 3),
            "kv_tokens_written": kv_tokens_written,
            "rss_after_kv_parts_mb": {k: round(v / 1e6, 1) for k, v in parts_after.items()},
            "load_avg": list(os.getloadavg()), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip(), "note": args.note}
    print(json.dumps(line))
    with open(args.out, "a") as out:
        out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
