#!/usr/bin/env python3
"""bench/embed_peers.py: the peers of tessera-embed-bench, run in the same device call, as JSON lines.

Peers:
  hf-transformers-sdpa   transformers' BertModel, attn_implementation="sdpa", --dtype (fp16) on cuda. Random
                         weights from a BertConfig at the BERT-base shape (cases fixed, latency, mixed), and the
                         real all-MiniLM-L6-v2 (case sentences) with sentence-transformers' pipeline written out:
                         sort by length, tokenize each batch padded to its longest, mean pooling, L2 normalisation.
  sentence-transformers  SentenceTransformer(all-MiniLM-L6-v2).half().encode(sentences, batch_size=b) (case sentences).
                         If the import fails, one line {"peer": "sentence-transformers", "error": ...} and the run goes on.

Cases (the shapes and definitions of tessera-embed-bench):
  fixed      B x S random ids (--batch 128, --seq-len 128), attention mask of ones: sequences/s
  latency    1 x S: ms, median and p90 of --latency-reps
  mixed      --mixed-texts texts (128) with lengths uniform in [--mixed-min, --mixed-max] ([16, 512]) from the same
             32-bit LCG as tessera-embed-bench (same --seed, same lengths), ONE batch padded to its longest text
             (as an embedding server pads a batch): real (unpadded) tokens/s, padded tokens reported too
  sentences  the first --sentences-count lines of bench/data/embed_sentences.txt at each --batches size (1, 32, 256),
             texts in and embeddings on the host out (tokenization timed): sentences/s

Every timed run ends with the embeddings copied to the host (a device sync), as Tessera's do. Times are wall
clock (perf_counter) around that; the CUDA-event time of the same runs goes in gpu_ms. Warm-up runs first.
Values are medians with p90, min and max. --budget-s skips (with an error line) any case that would start
after that many seconds.

  python3 bench/embed_peers.py [--cases fixed,latency,mixed,sentences] [--peers hf,st] [--model-dir DIR]
                               [--dtype fp16] [--budget-s 300]                  (commit from $TESSERA_COMMIT)
"""
import argparse
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0)
CASES = ("fixed", "latency", "mixed", "sentences")
PEERS = ("hf", "st")

torch = None  # imported in main(), so that --help works without torch
START = time.perf_counter()
DEADLINE = [math.inf]
COMMON = {}


def log(msg):
    print(f"[embed_peers {time.perf_counter() - START:7.1f}s] {msg}", file=sys.stderr, flush=True)


def csv(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def default_model_dir():
    base = os.environ.get("TESSERA_MODEL_DIR") or os.path.expanduser("~/.cache/tessera/models")
    return os.path.join(base, "all-minilm-l6-v2")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of fixed, latency, mixed, sentences")
    ap.add_argument("--peers", default=",".join(PEERS), help="hf (transformers), st (sentence-transformers)")
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--latency-reps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--mixed-texts", type=int, default=128)
    ap.add_argument("--mixed-min", type=int, default=16)
    ap.add_argument("--mixed-max", type=int, default=512)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--model-dir", default=default_model_dir(),
                    help="all-MiniLM-L6-v2 folder (default $TESSERA_MODEL_DIR/all-minilm-l6-v2)")
    ap.add_argument("--sentences", default=str(REPO / "bench" / "data" / "embed_sentences.txt"))
    ap.add_argument("--sentences-count", type=int, default=1024)
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--budget-s", type=float, default=300.0, help="0 = no limit")
    args = ap.parse_args()
    args.cases, args.peers = csv(args.cases), csv(args.peers)
    args.batches = [int(b) for b in csv(args.batches)]
    for name, allowed, got in (("case", CASES, args.cases), ("peer", PEERS, args.peers)):
        bad = [g for g in got if g not in allowed]
        if bad:
            ap.error(f"unknown {name}(s) {bad}; choose from {list(allowed)}")
    if not 1 <= args.mixed_min <= args.mixed_max <= BERT_BASE["max_position_embeddings"]:
        ap.error("need 1 <= --mixed-min <= --mixed-max <= 512")
    return args


# ---------------------------------------------------------------- output and timing

def percentile(values, q):
    """Nearest rank, as tessera-embed-bench and bench/serve_load.py."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered) / 100)))
    return ordered[rank - 1]


def emit(peer, case, **fields):
    line = {"bench": "embed_peers", "impl": peer, "peer": peer, "case": case}
    line.update(fields)
    line.update(COMMON)
    print(json.dumps(line), flush=True)


def emit_error(peer, case, err, **fields):
    msg = err if isinstance(err, str) else f"{type(err).__name__}: {str(err).strip()[:400]}"
    log(f"ERROR {peer}/{case}: {msg}")
    emit(peer, case, error=msg, **fields)


def over_budget(peer, case):
    if time.perf_counter() > DEADLINE[0]:
        emit_error(peer, case, "skipped: over --budget-s")
        return True
    return False


def timed(fn, reps, warmup):
    """(wall seconds, CUDA-event seconds) of each of `reps` calls of fn after `warmup` untimed ones; fn's own
    result reaches the host, and a synchronize closes each run besides."""
    for _ in range(max(1, warmup)):
        fn()
    torch.cuda.synchronize()
    walls, gpus = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        gpus.append(start.elapsed_time(end) / 1000.0)
    return walls, gpus


def rate_fields(count, walls, gpus, unit):
    """value = count / median wall time, with the spread; gpu_ms the median CUDA-event time."""
    med = percentile(walls, 50)
    return dict(value=count / med, unit=unit, median=count / med, p90=count / percentile(walls, 90),
                min=count / max(walls), max=count / min(walls), median_ms=med * 1000,
                gpu_ms=percentile(gpus, 50) * 1000, reps=len(walls))


# ---------------------------------------------------------------- inputs (the same as tessera-embed-bench)

def mixed_lengths(count, lo, hi, seed):
    """Numerical Recipes' 32-bit LCG, exactly as tessera-embed-bench draws the mixed lengths."""
    x, out = seed & 0xFFFFFFFF, []
    for _ in range(count):
        x = (1664525 * x + 1013904223) & 0xFFFFFFFF
        out.append(lo + (x >> 8) % (hi - lo + 1))
    return out


def read_sentences(path, count):
    lines = [l for l in Path(path).read_text().splitlines() if l]
    return lines[:count]


def torch_dtype(name):
    return torch.float16 if name == "fp16" else torch.bfloat16


# ---------------------------------------------------------------- HF transformers

def hf_bert_base(dtype):
    import transformers
    from transformers import AutoModel, BertConfig
    cfg = BertConfig(**BERT_BASE)
    with torch.device("cuda"):
        try:
            model = AutoModel.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
        except TypeError:  # older name of the dtype argument
            model = AutoModel.from_config(cfg, torch_dtype=dtype, attn_implementation="sdpa")
    model = model.to("cuda", dtype).eval()
    log(f"hf BertModel (random, BERT-base): {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
        f"attn={getattr(model.config, '_attn_implementation', '?')}, transformers {transformers.__version__}")
    return model


def embed_hf(model, ids, mask):
    """Mean pooling over the mask and L2 normalisation, as sentence-transformers' MiniLM does; to the host."""
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
    return torch.nn.functional.normalize(pooled.float(), dim=-1).cpu()


def hf_shape_cases(args):
    peer = "hf-transformers-sdpa"
    model_name = "bert-base (random weights)"
    try:
        model = hf_bert_base(torch_dtype(args.dtype))
    except Exception as err:  # noqa: BLE001
        emit_error(peer, "fixed", err, model=model_name)
        return
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    vocab = BERT_BASE["vocab_size"]
    with torch.inference_mode():
        if "fixed" in args.cases and not over_budget(peer, "fixed"):
            try:
                ids = torch.randint(1000, vocab, (args.batch, args.seq_len), device="cuda", generator=gen)
                mask = torch.ones_like(ids)
                walls, gpus = timed(lambda: embed_hf(model, ids, mask), args.reps, args.warmup)
                f = rate_fields(args.batch, walls, gpus, "seq/s")
                emit(peer, "fixed", model=model_name, batch=args.batch, seq_len=args.seq_len,
                     tokens_per_s=args.batch * args.seq_len / percentile(walls, 50), **f)
            except Exception as err:  # noqa: BLE001
                emit_error(peer, "fixed", err, model=model_name, batch=args.batch, seq_len=args.seq_len)
            torch.cuda.empty_cache()
        if "latency" in args.cases and not over_budget(peer, "latency"):
            try:
                ids = torch.randint(1000, vocab, (1, args.seq_len), device="cuda", generator=gen)
                mask = torch.ones_like(ids)
                walls, gpus = timed(lambda: embed_hf(model, ids, mask), args.latency_reps, max(args.warmup, 10))
                ms = [w * 1000 for w in walls]
                emit(peer, "latency", model=model_name, batch=1, seq_len=args.seq_len, value=percentile(ms, 50),
                     unit="ms", median=percentile(ms, 50), p90=percentile(ms, 90), min=min(ms), max=max(ms),
                     gpu_ms=percentile(gpus, 50) * 1000, reps=len(ms))
            except Exception as err:  # noqa: BLE001
                emit_error(peer, "latency", err, model=model_name, batch=1, seq_len=args.seq_len)
        if "mixed" in args.cases and not over_budget(peer, "mixed"):
            lengths = mixed_lengths(args.mixed_texts, args.mixed_min, args.mixed_max, args.seed)
            real, longest = sum(lengths), max(lengths)
            fields = dict(model=model_name, texts=args.mixed_texts, min_len=args.mixed_min, max_len=args.mixed_max,
                          seed=args.seed, real_tokens=real, longest=longest, padded_tokens=longest * len(lengths),
                          packing="one batch padded to its longest")
            try:
                ids = torch.zeros((len(lengths), longest), dtype=torch.long, device="cuda")
                mask = torch.zeros_like(ids)
                for i, n in enumerate(lengths):
                    ids[i, :n] = torch.randint(1000, vocab, (n,), device="cuda", generator=gen)
                    mask[i, :n] = 1
                walls, gpus = timed(lambda: embed_hf(model, ids, mask), args.reps, args.warmup)
                emit(peer, "mixed", **fields, **rate_fields(real, walls, gpus, "tok/s"))
            except Exception as err:  # noqa: BLE001
                emit_error(peer, "mixed", err, **fields)
    del model
    torch.cuda.empty_cache()


def hf_sentences(args, sentences):
    """all-MiniLM-L6-v2 through transformers with sentence-transformers' encode() pipeline written out."""
    peer = "hf-transformers-sdpa"
    from transformers import AutoModel, AutoTokenizer
    dtype = torch_dtype(args.dtype)
    try:
        tok = AutoTokenizer.from_pretrained(args.model_dir)
        try:
            model = AutoModel.from_pretrained(args.model_dir, dtype=dtype, attn_implementation="sdpa")
        except TypeError:
            model = AutoModel.from_pretrained(args.model_dir, torch_dtype=dtype, attn_implementation="sdpa")
        model = model.to("cuda", dtype).eval()
        max_len = json.loads((Path(args.model_dir) / "sentence_bert_config.json").read_text()).get("max_seq_length", 512)
    except Exception as err:  # noqa: BLE001
        emit_error(peer, "sentences", err, model="all-minilm-l6-v2")
        return
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))  # as encode() sorts, longest first

    def encode(batch_size):
        out = [None] * len(sentences)
        with torch.inference_mode():
            for at in range(0, len(order), batch_size):
                idx = order[at:at + batch_size]
                t = tok([sentences[i] for i in idx], padding=True, truncation=True, max_length=max_len,
                        return_tensors="pt").to("cuda")
                emb = embed_hf(model, t["input_ids"], t["attention_mask"])
                for k, i in enumerate(idx):
                    out[i] = emb[k]
        return out

    for b in args.batches:
        if over_budget(peer, "sentences"):
            return
        try:
            walls, gpus = timed(lambda: encode(b), max(1, args.reps // 2), 1)
            emit(peer, "sentences", model="all-minilm-l6-v2", batch=b, sentences=len(sentences),
                 max_seq_length=max_len, **rate_fields(len(sentences), walls, gpus, "sentences/s"))
        except Exception as err:  # noqa: BLE001
            emit_error(peer, "sentences", err, model="all-minilm-l6-v2", batch=b)
    del model
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- sentence-transformers

def st_sentences(args, sentences):
    peer = "sentence-transformers"
    try:
        import sentence_transformers
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer(args.model_dir, device="cuda")
        model = model.half() if args.dtype == "fp16" else model.to(torch.bfloat16)
        log(f"sentence-transformers {sentence_transformers.__version__}: max_seq_length {model.max_seq_length}")
    except Exception as err:  # noqa: BLE001 -- the import itself may fail on the device
        emit_error(peer, "sentences", err, model="all-minilm-l6-v2")
        return
    for b in args.batches:
        if over_budget(peer, "sentences"):
            return
        try:
            walls, gpus = timed(lambda: model.encode(sentences, batch_size=b, convert_to_numpy=True,
                                                     show_progress_bar=False), max(1, args.reps // 2), 1)
            emit(peer, "sentences", model="all-minilm-l6-v2", batch=b, sentences=len(sentences),
                 max_seq_length=model.max_seq_length, st_version=sentence_transformers.__version__,
                 **rate_fields(len(sentences), walls, gpus, "sentences/s"))
        except Exception as err:  # noqa: BLE001
            emit_error(peer, "sentences", err, model="all-minilm-l6-v2", batch=b)
    del model
    torch.cuda.empty_cache()


def main():
    args = parse_args()
    global torch
    import torch as _torch
    torch = _torch
    if not torch.cuda.is_available():
        print("embed_peers: CUDA is not available", file=sys.stderr)
        return 2
    try:
        import transformers
        transformers.logging.set_verbosity_error()
        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    if args.budget_s > 0:
        DEADLINE[0] = START + args.budget_s
    COMMON.update(backend="cuda", dtype=args.dtype, device=torch.cuda.get_device_name(0), torch=torch.__version__,
                  transformers=tf_version, date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  commit=os.environ.get("TESSERA_COMMIT", "unknown"))
    log(f"{COMMON['device']}, torch {torch.__version__}, transformers {tf_version}; cases {args.cases}, "
        f"peers {args.peers}, {args.dtype}")
    if "hf" in args.peers and any(c in args.cases for c in ("fixed", "latency", "mixed")):
        hf_shape_cases(args)
    if "sentences" in args.cases:
        sentences = read_sentences(args.sentences, args.sentences_count)
        if "st" in args.peers:
            st_sentences(args, sentences)
        if "hf" in args.peers:
            hf_sentences(args, sentences)
    return 0


if __name__ == "__main__":
    sys.exit(main())
