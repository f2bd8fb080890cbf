#!/usr/bin/env python3
"""bench/hf_peers.py: HF transformers peers of Tessera's GPU engine benchmarks, run in the same device call.

Random bf16 weights at the Llama shapes below (speed does not depend on the values), SDPA attention,
built on the GPU with LlamaConfig + AutoModelForCausalLM.from_config. Greedy, eos disabled, so every
sequence generates exactly --new-tokens. Random prompt ids of the exact length.

Modes:
  eager           transformers eager with its default dynamic KV cache
  static_compile  cache_implementation="static" + torch.compile of the decode step; --compile-style native
                  (default) is transformers' own auto-compile of the decode forward through
                  generation_config.compile_config = CompileConfig(fullgraph, mode); manual sets
                  model.forward = torch.compile(model.forward, mode=..., fullgraph=...) (prefill compiled too).
                  Warm-up generates (compile included) are not timed; the compile cost goes in its own line.

Cases (one JSON line per measurement on stdout, progress on stderr):
  decode   batch 1, --prompt-tokens prompt, --new-tokens greedy; each selected mode.
  prefill  eager, batch 1: prefill tok/s at --prefill-tokens, and TTFT (ms) of a --prompt-tokens prompt.
           Both = one forward of the prompt (use_cache=True, last-token logits only) + argmax, synchronised.
  offline  eager, batch of equal-length prompts at each --batches size: total and decode tok/s.
           (Batch 1 reuses the eager `decode` runs when those ran.)

Definitions (the same as bench/cpu_llamacpp.py):
  inside one generate, a streamer stamps (after a CUDA sync) every token as it leaves the GPU:
  prefill = time from the generate call to the first token (TTFT inside generate)
  decode tok/s  = batch * (new_tokens - 1) / (time from the first token to the last)
  total tok/s   = batch * (prompt_tokens + new_tokens) / wall time of the generate
  compile s     = wall of the first static generate - median wall of the timed ones
Values are medians of --reps runs (--prefill-reps for prefill/TTFT), with min and max.

Order: first every shape's eager cases (prefill, decode, offline), then every shape's static_compile decode
(about a minute of cold compile per shape dominates the run). --budget-s: a case that would start after
that many seconds is skipped with an error line (one that starts before it runs to its end), so the
caller's hard timeout should leave a case's worth (~1.5 min) of slack above it. Any failure of a case
(OOM, compile error) is one JSON line with "error", and the run goes on.

  python3 bench/hf_peers.py [--models a,b] [--modes eager,static_compile] [--cases decode,prefill,offline]
                            [--batches 1,8,32,64] [--reps 3] [--budget-s 300]     (commit from $TESSERA_COMMIT)
"""
import argparse
import datetime as dt
import gc
import inspect
import json
import os
import statistics
import sys
import time

SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192),
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0,
                           max_position_embeddings=2048),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0,
                      max_position_embeddings=4096),
}
MODES = ("eager", "static_compile")
CASES = ("decode", "prefill", "offline")

torch = None  # imported in main(), so that --help works without torch
START = time.perf_counter()


def log(msg):
    print(f"[hf_peers {time.perf_counter() - START:7.1f}s] {msg}", file=sys.stderr, flush=True)


def csv(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--models", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)} (default: all)")
    ap.add_argument("--modes", default=",".join(MODES), help="modes for the decode case (default: eager,static_compile)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of decode, prefill, offline (default: all)")
    ap.add_argument("--batches", default="1,8,32,64", help="offline batch sizes (default: 1,8,32,64)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length of decode/offline/TTFT (128)")
    ap.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per sequence (128)")
    ap.add_argument("--prefill-tokens", type=int, default=512, help="prompt length of the prefill tok/s line (512)")
    ap.add_argument("--reps", type=int, default=3, help="timed generate runs per measurement (3)")
    ap.add_argument("--prefill-reps", type=int, default=10, help="timed forwards per prefill/TTFT line (10)")
    ap.add_argument("--compile-style", choices=("native", "manual"), default="native",
                    help="native: transformers' compile_config auto-compile of decode; manual: model.forward = torch.compile(...)")
    ap.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode (reduce-overhead)")
    ap.add_argument("--no-fullgraph", action="store_true", help="compile with fullgraph=False")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="skip (with an error line) every case that would start after this many seconds; 0 = no limit (300)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.models, args.modes, args.cases = csv(args.models), csv(args.modes), csv(args.cases)
    args.batches = [int(b) for b in csv(args.batches)]
    for name, allowed, got in (("model", SHAPES, args.models), ("mode", MODES, args.modes), ("case", CASES, args.cases)):
        bad = [g for g in got if g not in allowed]
        if bad:
            ap.error(f"unknown {name}(s) {bad}; choose from {list(allowed)}")
    if args.new_tokens < 2 or args.prompt_tokens < 1 or args.reps < 1 or args.prefill_reps < 1:
        ap.error("--new-tokens >= 2, --prompt-tokens >= 1, --reps >= 1, --prefill-reps >= 1")
    return args


# ---------------------------------------------------------------- output

COMMON = {}


def spread(values, ndigits):
    return {"median": round(statistics.median(values), ndigits), "min": round(min(values), ndigits),
            "max": round(max(values), ndigits)}


def emit(case, model, mode, batch, prompt_tokens, new_tokens, value=None, unit=None, values=None, ndigits=2,
         **extra):
    line = {"bench": "hf_peers", "case": case, "model": model, "mode": mode, "batch": batch,
            "prompt_tokens": prompt_tokens, "new_tokens": new_tokens}
    if values:
        s = spread(values, ndigits)
        line.update(value=s["median"], unit=unit, **s, reps=len(values))
    else:
        line.update(value=None if value is None else round(value, ndigits), unit=unit)
    line.update(extra)
    line.update(COMMON)
    print(json.dumps(line), flush=True)


def emit_error(case, model, mode, batch, prompt_tokens, new_tokens, err):
    msg = err if isinstance(err, str) else f"{type(err).__name__}: {str(err).strip()[:400]}"
    log(f"ERROR {case}/{model}/{mode}/b{batch}: {msg}")
    emit(case, model, mode, batch, prompt_tokens, new_tokens, error=msg)


def free_cuda(reset_dynamo=False):
    gc.collect()
    if reset_dynamo:
        try:
            torch._dynamo.reset()
        except Exception:  # best effort
            pass
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- model

def build_model(name):
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig
    kw = dict(SHAPES[name])
    theta = kw.pop("rope_theta")
    kw.update(rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=None, pad_token_id=0, use_cache=True)
    params = inspect.signature(LlamaConfig.__init__).parameters
    if "rope_parameters" in params:  # transformers 5: rope settings live in one dict
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    else:
        kw["rope_theta"] = theta
    cfg = LlamaConfig(**kw)
    with torch.device("cuda"):  # parameters are created (and randomly initialised) on the GPU
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        except TypeError:  # older name of the dtype argument
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    p = next(model.parameters())
    if p.device.type != "cuda":
        model = model.to("cuda")
    if p.dtype != torch.bfloat16:
        model = model.to(torch.bfloat16)
    model.eval()
    gc_ = model.generation_config
    gc_.do_sample = False
    gc_.eos_token_id = None
    gc_.pad_token_id = 0
    gc_.bos_token_id = 1
    n_params = sum(p.numel() for p in model.parameters())
    attn = getattr(model.config, "_attn_implementation", "?")
    theta_read = getattr(model.config, "rope_theta", None) or (getattr(model.config, "rope_parameters", None) or {}).get("rope_theta")
    log(f"built {name}: {n_params / 1e6:.1f}M params, attn={attn}, rope_theta={theta_read}, "
        f"transformers {transformers.__version__}")
    return model


def random_ids(model, batch, length):
    return torch.randint(3, model.config.vocab_size, (batch, length), device="cuda", dtype=torch.long)


def _streamer_base():
    try:
        from transformers.generation.streamers import BaseStreamer
        return BaseStreamer
    except ImportError:
        return object


class StepClock:  # rebased on transformers' BaseStreamer in main()
    """generate() streamer: a timestamp (after a CUDA sync) for each put: the prompt, then every new token."""

    def __init__(self):
        self.times = []

    def put(self, value):
        torch.cuda.synchronize()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def mode_kwargs(model, mode, args):
    """generate() kwargs of a mode; for static_compile also sets up the compile (once per model)."""
    from transformers import GenerationConfig
    has_disable = hasattr(GenerationConfig(), "disable_compile")
    if mode == "eager":
        return {"disable_compile": True} if has_disable else {}
    fullgraph = not args.no_fullgraph
    if args.compile_style == "manual":
        if not getattr(model, "_hf_peers_compiled", False):
            model.forward = torch.compile(model.forward, mode=args.compile_mode, fullgraph=fullgraph)
            model._hf_peers_compiled = True
        kw = {"cache_implementation": "static"}
        if has_disable:
            kw["disable_compile"] = True
        return kw
    from transformers import CompileConfig  # transformers' own decode-step compile
    model.generation_config.compile_config = CompileConfig(fullgraph=fullgraph, dynamic=False, mode=args.compile_mode)
    kw = {"cache_implementation": "static"}
    if has_disable:
        kw["disable_compile"] = False
    return kw


def run_generate(model, ids, new_tokens, gen_kw):
    """One greedy generate; returns wall, prefill (to the first token) and decode (first to last token) seconds."""
    clock = StepClock()
    mask = torch.ones_like(ids)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, pad_token_id=0, streamer=clock, **gen_kw)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    seq = getattr(out, "sequences", out)
    got = seq.shape[1] - ids.shape[1]
    if got != new_tokens:
        raise RuntimeError(f"generated {got} tokens, expected {new_tokens}")
    if len(clock.times) < new_tokens:
        raise RuntimeError(f"streamer saw {len(clock.times)} puts for {new_tokens} tokens")
    t_first, t_last = clock.times[-new_tokens], clock.times[-1]
    return {"wall": t1 - t0, "prefill": t_first - t0, "decode": t_last - t_first}


# ---------------------------------------------------------------- cases

def case_decode(model, name, mode, args):
    P, N = args.prompt_tokens, args.new_tokens
    ids = random_ids(model, 1, P)
    gen_kw = mode_kwargs(model, mode, args)
    extra = {"attn": "sdpa", "dtype": "bfloat16"}
    if mode == "eager":
        run_generate(model, ids, 4, gen_kw)  # warm-up: cuBLAS handles, allocator, every kernel shape class
    else:
        extra.update(compile_style=args.compile_style, compile_mode=args.compile_mode,
                     fullgraph=not args.no_fullgraph)
        log(f"{name}/{mode}: first generate (compiles)")
        first = run_generate(model, ids, N, gen_kw)  # same shapes as the timed runs: one static cache, no recompile
        log(f"{name}/{mode}: first generate {first['wall']:.1f}s; second warm-up")
        run_generate(model, ids, N, gen_kw)  # CUDA-graph recording settles
    runs = []
    for _ in range(args.reps):
        runs.append(run_generate(model, ids, N, gen_kw))
    tps = [(N - 1) / r["decode"] for r in runs]
    emit("decode", name, mode, 1, P, N, unit="tok/s", values=tps,
         ms_per_token=round(statistics.median(r["decode"] / (N - 1) for r in runs) * 1e3, 4),
         prefill_ms_in_generate=round(statistics.median(r["prefill"] for r in runs) * 1e3, 3),
         wall_s=round(statistics.median(r["wall"] for r in runs), 4), **extra)
    log(f"{name}/{mode}: decode {statistics.median(tps):.1f} tok/s")
    if mode != "eager":
        compile_s = first["wall"] - statistics.median(r["wall"] for r in runs)
        emit("compile", name, mode, 1, P, N, value=compile_s, unit="s", ndigits=2,
             first_generate_s=round(first["wall"], 2), **extra)
    return runs


def case_prefill(model, name, args):
    fwd_kw = {"use_cache": True}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        fwd_kw["logits_to_keep"] = 1  # as generate does: logits of the last position only
    elif "num_logits_to_keep" in inspect.signature(model.forward).parameters:
        fwd_kw["num_logits_to_keep"] = 1

    def first_token_s(ids):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model(input_ids=ids, **fwd_kw)
            tok = out.logits[:, -1, :].argmax(-1)
        tok.item()  # syncs
        return time.perf_counter() - t0

    for case, length in (("prefill", args.prefill_tokens), ("ttft", args.prompt_tokens)):
        if over_budget(case, name, "eager", 1, length, 1):
            continue
        try:
            ids = random_ids(model, 1, length)
            for _ in range(2):
                first_token_s(ids)
            times = [first_token_s(ids) for _ in range(args.prefill_reps)]
            if case == "prefill":
                emit("prefill", name, "eager", 1, length, 1, unit="tok/s", values=[length / t for t in times],
                     ms=round(statistics.median(times) * 1e3, 3), attn="sdpa", dtype="bfloat16")
            else:
                emit("ttft", name, "eager", 1, length, 1, unit="ms", values=[t * 1e3 for t in times], ndigits=3,
                     attn="sdpa", dtype="bfloat16")
            log(f"{name}: {case} {length} tokens {statistics.median(times) * 1e3:.2f} ms")
        except Exception as err:  # noqa: BLE001 -- reported, then the next case
            emit_error(case, name, "eager", 1, length, 1, err)
            free_cuda()


def case_offline(model, name, args, b1_runs):
    P, N = args.prompt_tokens, args.new_tokens
    gen_kw = mode_kwargs(model, "eager", args)
    for b in args.batches:
        if over_budget("offline", name, "eager", b, P, N):
            continue
        try:
            torch.cuda.reset_peak_memory_stats()
            if b == 1 and b1_runs:
                runs, note = b1_runs, "same runs as the eager decode line"
            else:
                ids = random_ids(model, b, P)
                run_generate(model, ids, 2, gen_kw)  # warm-up at this batch size
                runs = [run_generate(model, ids, N, gen_kw) for _ in range(args.reps)]
                note = None
                del ids
            peak = torch.cuda.max_memory_allocated() / 2**30
            extra = {"wall_s": round(statistics.median(r["wall"] for r in runs), 4),
                     "prefill_ms_in_generate": round(statistics.median(r["prefill"] for r in runs) * 1e3, 3),
                     "peak_mem_gib": round(peak, 2), "attn": "sdpa", "dtype": "bfloat16"}
            if note:
                extra["note"] = note
            total = [b * (P + N) / r["wall"] for r in runs]
            decode = [b * (N - 1) / r["decode"] for r in runs]
            emit("offline_total", name, "eager", b, P, N, unit="tok/s", values=total, **extra)
            emit("offline_decode", name, "eager", b, P, N, unit="tok/s", values=decode, **extra)
            log(f"{name}: offline b{b} total {statistics.median(total):.0f} tok/s, "
                f"decode {statistics.median(decode):.0f} tok/s")
        except Exception as err:  # noqa: BLE001 -- OOM etc.: reported, then the next batch
            emit_error("offline", name, "eager", b, P, N, err)
            free_cuda()


DEADLINE = [None]


def load(name, mode, args):
    torch.manual_seed(args.seed)
    if over_budget("build", name, mode, None, None, None):
        return None
    try:
        return build_model(name)
    except Exception as err:  # noqa: BLE001
        emit_error("build", name, mode, None, None, None, err)
        free_cuda()
        return None


def unload(name):
    free_cuda(reset_dynamo=True)
    log(f"{name}: freed, {torch.cuda.memory_allocated() / 2**30:.2f} GiB still allocated")


def over_budget(case, model, mode, batch, prompt_tokens, new_tokens):
    if DEADLINE[0] is not None and time.perf_counter() > DEADLINE[0]:
        emit_error(case, model, mode, batch, prompt_tokens, new_tokens, "skipped: past --budget-s")
        return True
    return False


def main():
    args = parse_args()
    global torch
    import torch as _torch
    torch = _torch
    import transformers
    transformers.logging.set_verbosity_error()
    global StepClock
    StepClock = type("StepClock", (StepClock, _streamer_base()), {})
    if not torch.cuda.is_available():
        print("hf_peers: CUDA is not available", file=sys.stderr)
        return 2
    if args.budget_s > 0:
        DEADLINE[0] = START + args.budget_s
    COMMON.update(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                  transformers=transformers.__version__,
                  date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  commit=os.environ.get("TESSERA_COMMIT", "unknown"))
    log(f"{COMMON['device']}, torch {torch.__version__}, transformers {transformers.__version__}; "
        f"models {args.models}, modes {args.modes}, cases {args.cases}")
    P, N = args.prompt_tokens, args.new_tokens
    # Phase 1, every shape: the eager cases (quick, certain). Phase 2, every shape: static cache + compile
    # (about a minute of cold compile per shape), so that a budget cut loses the compiled rows first.
    if any(c in args.cases for c in ("prefill", "offline")) or ("decode" in args.cases and "eager" in args.modes):
        for name in args.models:
            model = load(name, "eager", args)
            if model is None:
                continue
            b1_runs = None
            if "prefill" in args.cases:
                case_prefill(model, name, args)
            if "decode" in args.cases and "eager" in args.modes and not over_budget("decode", name, "eager", 1, P, N):
                try:
                    b1_runs = case_decode(model, name, "eager", args)
                except Exception as err:  # noqa: BLE001
                    emit_error("decode", name, "eager", 1, P, N, err)
                    free_cuda()
            if "offline" in args.cases:
                case_offline(model, name, args, b1_runs)
            del model, b1_runs
            unload(name)
    if "decode" in args.cases and "static_compile" in args.modes:
        for name in args.models:
            if over_budget("decode", name, "static_compile", 1, P, N):
                continue
            model = load(name, "static_compile", args)
            if model is None:
                continue
            try:
                case_decode(model, name, "static_compile", args)
            except Exception as err:  # noqa: BLE001 -- compile errors included
                emit_error("decode", name, "static_compile", 1, P, N, err)
            # the compiled call and the static cache hang off the model; CUDA-graph pools go with the dynamo reset
            for attr in ("_compiled_call", "_cache", "forward"):
                try:
                    if attr in vars(model):
                        delattr(model, attr)
                except Exception:  # noqa: BLE001
                    pass
            del model
            unload(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
