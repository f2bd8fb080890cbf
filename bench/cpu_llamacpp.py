#!/usr/bin/env python3
"""bench/cpu_llamacpp.py: CPU prefill and decode tokens/s of Tessera beside llama.cpp on one GGUF.

Both run the very same GGUF file with the same thread count, the same prompt text (built to an exact
token count with llama.cpp's tokenizer of that GGUF) and the same number of greedy decode tokens.
Repetitions alternate between the two, so load from other processes hits both alike; the median is
reported with min/max. One JSON line per (impl, prompt length, phase) goes to stdout and to --out,
plus one line per prompt length with the Tessera / llama.cpp ratios.

Definitions (identical for both):
  prefill tok/s = prompt tokens / TTFT, TTFT = prompt evaluation + first-token selection
  decode tok/s  = (generated - 1) / (time from the first token to the last)
Model load time is excluded for both.

Tessera runs as `tessera generate --model GGUF --prompt TEXT --max-tokens N --temperature 0
--threads T`, whose last stdout line is a JSON object of usage and timings. llama.cpp runs in this
process through llama-cpp-python (`pip install llama-cpp-python`, built from source;
bench/cpu_llamacpp.sh installs it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GGUF_REL = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"

# Plain prose written for this benchmark; repeated until the prompt is long enough.
PROSE = (
    "The harbour town woke slowly. Fishing boats rocked against the pier while gulls argued over the "
    "morning catch, and the baker on the corner pulled the first trays of bread from an oven that had "
    "been burning since four. Across the square, the clock on the old customs house ran eleven minutes "
    "late, as it had for as long as anyone could remember, and nobody saw any reason to fix it. "
    "Teachers walked to the school on the hill, shopkeepers rolled up their shutters, and a ferry "
    "sounded its horn twice before leaving for the islands. By noon the wind had turned, carrying the "
    "smell of salt and diesel up the narrow streets, where children chased a dog that had stolen a "
    "glove. In the library, a retired engineer explained to anyone who would listen how the tide "
    "tables were computed before there were computers, drawing curves on the back of an envelope. "
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def default_model() -> Path:
    for base in (os.environ.get("TESSERA_MODEL_DIR"), str(Path.home() / ".cache/tessera/models"), "/tmp/models-test"):
        if base and (Path(base) / GGUF_REL).exists():
            return Path(base) / GGUF_REL
    return Path(os.environ.get("TESSERA_MODEL_DIR", "/tmp/models-test")) / GGUF_REL


def default_tessera() -> str | None:
    for cand in ("build/server/tessera", "build-cpu/server/tessera", "build/tessera"):
        if (REPO / cand).exists():
            return str(REPO / cand)
    return shutil.which("tessera")


def tessera_build(binary: str) -> dict:
    """Binary path and the optimisation flags of the build tree it came from, when it has one."""
    info = {"tessera_binary": os.path.relpath(binary, REPO) if binary.startswith(str(REPO)) else binary}
    for parent in Path(binary).resolve().parents:
        commands = parent / "compile_commands.json"
        if commands.exists():
            for entry in json.loads(commands.read_text()):
                if "/engine/" in entry["file"]:
                    flags = [f for f in entry["command"].split() if f.startswith(("-O", "-march", "-g", "-DNDEBUG"))]
                    info["tessera_cxx_flags"] = " ".join(flags)
                    break
            break
    return info


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


class LlamaCpp:
    def __init__(self, model: Path, threads: int, n_ctx: int):
        import llama_cpp  # imported here so --impl tessera works without it

        self.version = getattr(llama_cpp, "__version__", "unknown")
        # n_batch = n_ubatch = n_ctx: the whole prompt is one batch, as Tessera's prefill is one pass.
        self.llm = llama_cpp.Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                                   n_threads=threads, n_threads_batch=threads, logits_all=False,
                                   verbose=False)

    def prompt_of_length(self, n_tokens: int) -> tuple[str, list[int]]:
        """Text whose tokenization (as both engines run it: with BOS if the GGUF asks for one) is
        exactly n_tokens long."""
        text = PROSE
        while len(self.llm.tokenize(text.encode(), add_bos=False)) < n_tokens + 8:
            text += PROSE
        toks = self.llm.tokenize(text.encode(), add_bos=False)
        bos = len(self.llm.tokenize(b"", add_bos=True))  # 1 if the model adds BOS, else 0
        body = n_tokens - bos
        # Detokenizing a cut can re-merge differently; shorten until the round trip is exact.
        for cut in range(body, body - 16, -1):
            candidate = self.llm.detokenize(toks[:cut]).decode("utf-8", errors="ignore")
            ids = self.llm.tokenize(candidate.encode(), add_bos=True)
            if len(ids) == n_tokens:
                return candidate, ids
            if len(ids) < n_tokens:
                # pad with a word that tokenizes to a single token after a space
                for pad in (" the", " a", " and"):
                    ids2 = self.llm.tokenize((candidate + pad).encode(), add_bos=True)
                    if len(ids2) == n_tokens:
                        return candidate + pad, ids2
        raise RuntimeError(f"could not build a prompt of exactly {n_tokens} tokens")

    def run(self, prompt_ids: list[int], decode_tokens: int) -> dict:
        import numpy as np

        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt_ids)
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t_first = time.perf_counter()
        generated = 1
        # EOS is ignored so both engines decode the same number of tokens.
        while generated < decode_tokens:
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            generated += 1
        t_end = time.perf_counter()
        return {"prompt_tokens": len(prompt_ids), "generated_tokens": generated,
                "ttft_ms": (t_first - t0) * 1e3, "decode_ms": (t_end - t_first) * 1e3}


class Tessera:
    def __init__(self, binary: str, model: Path, threads: int, extra: list[str] | None = None):
        self.binary, self.model, self.threads = binary, model, threads
        self.extra = list(extra or [])  # more `tessera generate` flags, e.g. --cpu-activation-bits 8
        # Optional flags are passed only when this build's CLI has them (recorded in each line).
        help_text = subprocess.run([binary, "generate", "--help"], capture_output=True, text=True).stdout
        self.flags = [f for f in ("--ignore-eos", "--threads") if f in help_text]

    def run(self, prompt: str, decode_tokens: int) -> dict:
        cmd = [self.binary, "generate", "--model", str(self.model), "--prompt", prompt, "--max-tokens",
               str(decode_tokens), "--temperature", "0"]
        if "--ignore-eos" in self.flags:
            cmd.append("--ignore-eos")
        if "--threads" in self.flags:
            cmd += ["--threads", str(self.threads)]
        cmd += self.extra
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), OPENBLAS_NUM_THREADS=str(self.threads))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        last = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
        if not last:
            raise RuntimeError(f"tessera generate printed no JSON line; stdout tail: {proc.stdout[-500:]}")
        usage = json.loads(last[-1])
        # Field names as `tessera generate` prints them; nested under "usage"/"timings" or flat.
        flat = dict(usage)
        for key in ("usage", "timings"):
            if isinstance(usage.get(key), dict):
                flat.update(usage[key])
        prompt_tokens = int(flat["prompt_tokens"])
        generated = int(flat.get("generated_tokens", flat.get("completion_tokens", 0)))
        ttft_ms = float(flat["ttft_ms"])
        if "decode_ms" in flat:
            decode_ms = float(flat["decode_ms"])
        elif "total_ms" in flat:
            decode_ms = float(flat["total_ms"]) - ttft_ms
        else:  # tokens/s over the decode phase: (generated - 1) / decode time
            tps = float(flat.get("decode_tokens_per_s", flat.get("tokens_per_s")))
            decode_ms = (generated - 1) / tps * 1e3 if tps > 0 else float("nan")
        return {"prompt_tokens": prompt_tokens, "generated_tokens": generated, "ttft_ms": ttft_ms,
                "decode_ms": decode_ms, "raw": usage}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=default_model())
    ap.add_argument("--tessera", default=default_tessera(), help="path to the tessera binary")
    ap.add_argument("--impl", choices=["both", "llama.cpp", "tessera"], default="both")
    ap.add_argument("--prompt-lengths", default="128,512")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tessera-arg", action="append", default=[],
                    help="one more flag for `tessera generate` (repeat), e.g. --tessera-arg=--cpu-activation-bits=8")
    ap.add_argument("--note", default="", help="free text recorded in every line (e.g. how the run was isolated)")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/cpu_smollm2_135m.jsonl")
    args = ap.parse_args()

    if not args.model.exists():
        print(f"model not found: {args.model} (set TESSERA_MODEL_DIR or pass --model)", file=sys.stderr)
        return 2
    lengths = [int(x) for x in args.prompt_lengths.split(",")]
    want_llama = args.impl in ("both", "llama.cpp")
    want_tessera = args.impl in ("both", "tessera")
    if want_tessera and not args.tessera:
        print("tessera binary not found (build it or pass --tessera)", file=sys.stderr)
        return 2

    # llama.cpp's tokenizer builds the prompts even when only Tessera is timed.
    llama = LlamaCpp(args.model, args.threads, n_ctx=max(lengths) + args.decode_tokens + 16)
    tessera = Tessera(args.tessera, args.model, args.threads, args.tessera_arg) if want_tessera else None
    common = {
        "model": args.model.name, "threads": args.threads, "device": f"cpu: {cpu_model()} x{os.cpu_count()}",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(),
        "llama_cpp_python": llama.version, "reps": args.reps, "load_avg_start": load_avg(),
    }
    if args.note:
        common["note"] = args.note
    if tessera:
        common["tessera_flags"] = tessera.flags + tessera.extra
        common.update(tessera_build(args.tessera))
    lines = []
    for n_prompt in lengths:
        text, ids = llama.prompt_of_length(n_prompt)
        results: dict[str, list[dict]] = {"llama.cpp": [], "tessera": []}
        for rep in range(args.warmup + args.reps):
            if want_llama:
                r = llama.run(ids, args.decode_tokens)
                if rep >= args.warmup:
                    results["llama.cpp"].append(r)
            if want_tessera:
                r = tessera.run(text, args.decode_tokens)
                if r["prompt_tokens"] != len(ids):
                    print(f"warning: tessera tokenized the {len(ids)}-token prompt to {r['prompt_tokens']}",
                          file=sys.stderr)
                if rep >= args.warmup:
                    results["tessera"].append(r)
        medians = {}
        for impl, runs in results.items():
            if not runs:
                continue
            prefill = [r["prompt_tokens"] / (r["ttft_ms"] / 1e3) for r in runs]
            decode = [(r["generated_tokens"] - 1) / (r["decode_ms"] / 1e3) for r in runs]
            shape = {"prompt_tokens": runs[0]["prompt_tokens"], "generated_tokens": runs[0]["generated_tokens"]}
            for phase, tps, ms in (("prefill", prefill, [r["ttft_ms"] for r in runs]),
                                   ("decode", decode,
                                    [r["decode_ms"] / max(1, r["generated_tokens"] - 1) for r in runs])):
                s_tps, s_ms = summary(tps), summary(ms)
                line = {"impl": impl, "phase": phase, "shape": shape, "tokens_per_s": round(s_tps["median"], 2),
                        "median_ms": round(s_ms["median"], 3),  # prefill: TTFT; decode: per token
                        "spread": {"tokens_per_s_min": round(s_tps["min"], 2),
                                   "tokens_per_s_max": round(s_tps["max"], 2)},
                        **common, "load_avg_end": load_avg()}
                lines.append(line)
                medians[(impl, phase)] = s_tps["median"]
        if ("tessera", "prefill") in medians and ("llama.cpp", "prefill") in medians:
            lines.append({"impl": "tessera/llama.cpp", "shape": {"prompt_tokens": len(ids),
                                                                 "decode_tokens": args.decode_tokens},
                          "prefill_ratio": round(medians[("tessera", "prefill")] / medians[("llama.cpp", "prefill")], 3),
                          "decode_ratio": round(medians[("tessera", "decode")] / medians[("llama.cpp", "decode")], 3),
                          **common, "load_avg_end": load_avg()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for line in lines:
            print(json.dumps(line))
            f.write(json.dumps(line) + "\n")
    print_bars(lines)
    return 0


# The bars the CPU backend is held to (2 threads, this GGUF): Tessera / llama.cpp, medians of --reps runs.
BARS = {"decode": (1.0, 1.2), "prefill": (1.0, 1.5)}


def print_bars(lines: list[dict]) -> None:
    """The bars' table from this run's ratio lines, to stderr (stdout stays one JSON object a line)."""
    ratios = [ln for ln in lines if ln.get("impl") == "tessera/llama.cpp"]
    if not ratios:
        return
    out = sys.stderr
    print(f"\n| case | tessera / llama.cpp | must | goal | load avg (start -> end) |", file=out)
    print("| --- | --- | --- | --- | --- |", file=out)
    for ln in ratios:
        n = ln["shape"]["prompt_tokens"]
        load = f"{ln['load_avg_start']} -> {ln['load_avg_end']}"
        for phase in ("decode", "prefill"):
            must, goal = BARS[phase]
            r = ln[f"{phase}_ratio"]
            verdict = "goal" if r >= goal else "must" if r >= must else "BELOW"
            case = (f"decode ({ln['shape']['decode_tokens']} tokens after a {n}-token prompt)" if phase == "decode"
                    else f"prefill, {n} tokens")
            print(f"| {case} | {r:.3f}x ({verdict}) | >= {must}x | >= {goal}x | {load} |", file=out)


if __name__ == "__main__":
    sys.exit(main())
