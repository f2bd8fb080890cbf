#!/usr/bin/env python3
"""tuner/calibrate_int4.py: trains a GGUF decoder's linear weights for the CUDA backend's int4_g128
format and writes them as the sidecar file the server and `tessera tune` load with that format.

Why: the CUDA backend quantizes each layer linear (q, k, v, o, gate, up, down) to int4_g128 as it
loads it: asymmetric 4-bit, groups of 128 along the input, round to nearest. On a small model that
costs a lot of quality (SmolLM2-135M: +56 % perplexity), and post-training methods (GPTQ, AWQ,
rotations) stop near +9 %. This tool instead trains the weights the backend will round, by
quantization-aware distillation:

- the student's forward rounds each linear exactly as the backend does at load: weight to bf16,
  per group min rounded down to bf16, scale = (max - min) / 15 rounded up to bf16, q = rint((w -
  min) / scale) clamped to [0, 15] (kernels/cuda/gemm/quantized_weights.cu); gradients pass the
  rounding straight through to the latent fp32 weights;
- the loss is the KL divergence of the student's next-token distributions from the unquantized
  model's, on calibration text;
- only the layer linears train; embeddings and norms stay the model's own.

The sidecar holds the latent weights in bf16, so the backend's own round-to-nearest at load makes
exactly the grid the student was trained on. It is `<model>.int4_g128.gguf` beside `<model>.gguf`:
the source's metadata, the linears in the source's names and layout, and three keys the loader
checks: tessera.calibration.format (int4_g128), tessera.calibration.source_sha256 (the model file's
sha256) and tessera.calibration.method (how it was made).

Calibration text: by default exllamav2's calibration set, which scripts/fetch-models installs
(hash-checked, never committed): its wiki.utf8, which is also the tuner's evaluation text, past
--skip-chars, and web (c4), code, multilingual, technical and children's-story texts; each training
sequence comes from one text chosen uniformly, so the weights fit no one kind of text. The tuner scores
the first `tokens * 8 + 4096` characters of wiki.utf8's prose (36,864 for its 4,096 tokens), so the
default skip (100,000) keeps its held-out text out of training; a smaller skip is refused. The last
--validation-tokens of each text are held back for a validation perplexity, the tuner's held-out
window is scored before and after training, and so is each --check-text (text unlike any calibration
text, e.g. Shakespeare): all for the log only, as the tuner's own measurement is the one that counts.

Needs torch (a CUDA GPU; minutes on an H100 for a 135M model), numpy, the PyPI package gguf, and a
tessera binary for the tokenizer.
  python3 tuner/calibrate_int4.py --model ~/.cache/tessera/models/smollm2-135m-instruct --tessera tessera
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GROUP = 128
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def fail(msg: str) -> None:
    print(f"calibrate_int4: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------------
# Inputs


def model_file(path: Path) -> Path:
    """The model's .gguf: the path itself, or the one .gguf in the folder (sidecars aside)."""
    if path.is_file():
        return path
    ggufs = sorted(p for p in path.glob("*.gguf") if not p.name.endswith(".int4_g128.gguf"))
    if len(ggufs) != 1:
        fail(f"--model: {path} must be a .gguf file or a folder with exactly one .gguf (found {len(ggufs)})")
    return ggufs[0]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def prose(path: Path) -> str:
    """The text as tuner/measure.cpp reads it: lines without <doc ...> markup, each ending in a newline."""
    with open(path, encoding="utf-8") as f:
        return "".join(line if line.endswith("\n") else line + "\n"
                       for line in f if not (line.startswith("<doc") or line.startswith("</doc>")))


def tokenize(tessera: str, model: Path, texts: list[str]) -> list[list[int]]:
    """Token ids from tessera's own tokenizer, without special tokens (as the tuner scores text)."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    try:
        run = subprocess.run([tessera, "tokenize", "--model", str(model), "--lines", f.name],
                             capture_output=True, text=True)
    except OSError as e:
        fail(f"--tessera: cannot run {tessera}: {e}")
    finally:
        os.unlink(f.name)
    if run.returncode != 0:
        fail(f"--tessera: `{tessera} tokenize` failed: {run.stderr.strip()[-500:]}")
    return [json.loads(line)["ids"] for line in run.stdout.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------
# The model (Llama architecture, GGUF layout: q/k rows permuted so RoPE rotates adjacent pairs)


class Decoder:
    def __init__(self, path: Path, device: str):
        import gguf
        import torch

        self.reader = gguf.GGUFReader(path)
        field = lambda k: self.reader.fields[k].contents()  # noqa: E731
        arch = field("general.architecture")
        if arch not in ("llama", "mistral"):
            fail(f"--model: architecture {arch} is not a decoder this tool trains (llama, mistral)")
        self.layers = int(field(f"{arch}.block_count"))
        self.hidden = int(field(f"{arch}.embedding_length"))
        self.heads = int(field(f"{arch}.attention.head_count"))
        self.kv_heads = int(field(f"{arch}.attention.head_count_kv"))
        self.head_dim = self.hidden // self.heads
        self.eps = float(field(f"{arch}.attention.layer_norm_rms_epsilon"))
        theta = float(field(f"{arch}.rope.freq_base")) if f"{arch}.rope.freq_base" in self.reader.fields else 10000.0
        scaling = f"{arch}.rope.scaling.type"
        if scaling in self.reader.fields and field(scaling) not in ("none", ""):
            log(f"warning: {scaling} is {field(scaling)}; this tool's forward uses unscaled RoPE, so teacher and "
                "student both differ a little from the served model")
        self.w = {t.name: torch.from_numpy(np.ascontiguousarray(
            gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))).to(device) for t in self.reader.tensors}
        self.lm_head = self.w.get("output.weight", self.w["token_embd.weight"])
        self.inv_freq = theta ** (-torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float64) / self.head_dim)
        log(f"model {path.name}: {self.layers} layers, hidden {self.hidden}, heads {self.heads}/{self.kv_heads}, "
            f"eps {self.eps}, theta {theta}, tied output {'output.weight' not in self.w}")

    def linear_names(self) -> list[str]:
        return [f"blk.{i}.{n}.weight" for i in range(self.layers) for n in LINEARS]

    def rope(self, x, cos, sin):
        """x [B, heads, T, D]: pairs (2i, 2i + 1) rotated by pos * theta^(-2i / D)."""
        import torch

        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    def rms_norm(self, x, w):
        import torch

        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def logits(self, ids, linear):
        """ids [B, T] -> logits [B, T, vocab]; linear(name) gives each layer linear's weight."""
        import torch
        import torch.nn.functional as F

        B, T = ids.shape
        angle = torch.arange(T, device=ids.device, dtype=torch.float64)[:, None] * self.inv_freq
        cos, sin = angle.cos().float(), angle.sin().float()
        x = self.w["token_embd.weight"][ids]
        for i in range(self.layers):
            p = f"blk.{i}."
            h = self.rms_norm(x, self.w[p + "attn_norm.weight"])
            q = (h @ linear(p + "attn_q.weight").T).view(B, T, self.heads, self.head_dim).transpose(1, 2)
            k = (h @ linear(p + "attn_k.weight").T).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
            v = (h @ linear(p + "attn_v.weight").T).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
            a = F.scaled_dot_product_attention(self.rope(q, cos, sin), self.rope(k, cos, sin), v, is_causal=True,
                                               enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(B, T, self.hidden) @ linear(p + "attn_output.weight").T
            h = self.rms_norm(x, self.w[p + "ffn_norm.weight"])
            x = x + (F.silu(h @ linear(p + "ffn_gate.weight").T) * (h @ linear(p + "ffn_up.weight").T)) @ \
                linear(p + "ffn_down.weight").T
        return self.rms_norm(x, self.w["output_norm.weight"]) @ self.lm_head.T


# ---------------------------------------------------------------------------------------------------
# The backend's int4_g128 rounding


def bf16_directed(x, up: bool):
    """x (fp32) rounded down (up=False) or up to a bfloat16 value, as __float2bfloat16_rd / _ru for
    finite x: bf16 keeps fp32's exponent and 8 significant bits, so its step at |x| is
    2^(exponent - 7), or 2^-133 among the subnormals."""
    import torch

    _, e = torch.frexp(x)
    step = torch.ldexp(torch.ones_like(x), torch.clamp(e - 1, min=-126) - 7)
    return (torch.ceil(x / step) if up else torch.floor(x / step)) * step


def int4_g128_round(w):
    """What the CUDA backend makes of weight w [n, k] when it loads it as int4_g128, dequantized."""
    import torch

    wb = w.to(torch.bfloat16).float()  # the backend is given bf16 weights
    n, k = wb.shape
    whole = GROUP * (k // GROUP)
    spans = ([(0, whole, GROUP)] if whole else []) + ([(whole, k, k - whole)] if whole < k else [])
    parts = []
    for start, end, size in spans:  # the whole groups at once, then the shorter last group
        g = wb[:, start:end].reshape(n, -1, size)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        minimum = bf16_directed(lo, up=False)
        scale = bf16_directed(((hi - minimum) / 15.0).clamp(min=0.0), up=True)
        inverse = torch.where(scale > 0, 1.0 / torch.where(scale > 0, scale, torch.ones_like(scale)), 0.0)
        q = torch.clamp(torch.round((g - minimum) * inverse), 0, 15)
        parts.append((q * scale + minimum).reshape(n, end - start))
    return torch.cat(parts, dim=1)


def straight_through(w):
    """int4_g128_round(w) forward, identity backward."""
    return w + (int4_g128_round(w.detach()) - w).detach()


# ---------------------------------------------------------------------------------------------------
# Training and scoring


def perplexity(model: Decoder, ids, window: int, linear) -> float:
    """As tuner/measure.cpp: independent windows, each predicting its own next tokens."""
    import torch

    nll, count = 0.0, 0
    with torch.no_grad():
        for w in range(ids.numel() // window):
            chunk = ids[w * window:(w + 1) * window][None]
            logp = torch.log_softmax(model.logits(chunk, linear)[0, :-1].double(), -1)
            nll -= float(logp.gather(1, chunk[0, 1:, None]).sum())
            count += window - 1
    return math.exp(nll / count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a .gguf file, or a folder holding one")
    ap.add_argument("--tessera", default="tessera", help="tessera binary, for its tokenizer")
    ap.add_argument("--text", action="append", default=[], metavar="FILE",
                    help="calibration text (repeatable; default: the --eval-text past --skip-chars, and every "
                         ".utf8 file in calibration-text/ beside the model's folder)")
    ap.add_argument("--eval-text", help="the tuner's quality text (default: eval-text-wiki/wiki.utf8 beside the "
                                        "model's folder): its held-out start is scored and never trained on")
    ap.add_argument("--skip-chars", type=int, default=100_000, help="training on --eval-text starts past this much")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step, each from one text chosen uniformly")
    ap.add_argument("--length", type=int, default=512, help="tokens per sequence")
    ap.add_argument("--lr", type=float, default=1e-4, help="Adam's peak learning rate (cosine decay, 5 %% warm-up)")
    ap.add_argument("--validation-tokens", type=int, default=8 * 512, help="held back from the end of each text")
    ap.add_argument("--eval-tokens", type=int, default=4096, help="the tuner's held-out tokens, scored for the log")
    ap.add_argument("--eval-window", type=int, default=512)
    ap.add_argument("--check-text", action="append", default=[], metavar="FILE",
                    help="also score the first --eval-tokens tokens of this text (repeatable): a check, on text "
                         "unlike the calibration text, that training did not fit its domain")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="sidecar path (default: <model>.int4_g128.gguf beside the model)")
    ap.add_argument("--result", help="append the run's JSON line to this file")
    args = ap.parse_args()
    for name in ("steps", "batch", "length", "validation_tokens", "eval_window"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if not args.lr > 0:
        fail(f"--lr: must be positive, got {args.lr}")

    src = model_file(Path(args.model).expanduser())
    out = Path(args.out) if args.out else src.with_name(src.stem + ".int4_g128.gguf")
    eval_path = Path(args.eval_text) if args.eval_text else src.parent.parent / "eval-text-wiki/wiki.utf8"
    if not eval_path.is_file():
        fail(f"--eval-text: {eval_path} is not a file (scripts/fetch-models installs eval-text-wiki)")
    held_out = args.eval_tokens * 8 + 4096  # the characters tuner/measure.cpp reads for its quality score
    sources, described = calibration_texts(args, eval_path, held_out)
    checks = {}
    for path in map(Path, args.check_text):
        if not path.is_file():
            fail(f"--check-text: {path} is not a file")
        checks[path.stem] = path.read_text(encoding="utf-8")[:held_out]

    try:
        import torch
        import gguf  # noqa: F401  (Decoder and write_sidecar read and write GGUF with it)
    except ImportError as e:
        fail(f"needs torch and gguf (pip install gguf): {e}")
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU (training on the CPU would take hours)")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    device = "cuda"

    eval_ids, *ids = tokenize(args.tessera, src, [prose(eval_path)[:held_out], *sources.values(), *checks.values()])
    source_ids, check_ids = ids[:len(sources)], ids[len(sources):]
    train, scored = [], {"held_out": torch.tensor(eval_ids[:args.eval_tokens], device=device)}
    for name, tokens in zip(sources, source_ids):
        if len(tokens) < args.validation_tokens + args.length * 4:
            fail(f"--text: {name} has {len(tokens)} tokens, too few for --validation-tokens "
                 f"{args.validation_tokens} and --length {args.length}")
        train.append(torch.tensor(tokens[:-args.validation_tokens], device=device))
        scored[f"validation_{name}"] = torch.tensor(tokens[-args.validation_tokens:], device=device)
    for name, tokens in zip(checks, check_ids):
        if len(tokens) < args.eval_window:
            fail(f"--check-text: {name} has {len(tokens)} tokens, fewer than --eval-window {args.eval_window}")
        scored[name] = torch.tensor(tokens[:args.eval_tokens], device=device)
    log(f"calibration: {described}; " + ", ".join(f"{n} {t.numel()}" for n, t in zip(sources, train)) +
        f" training tokens, {args.validation_tokens} of each held back; held-out: {scored['held_out'].numel()} tokens")

    model = Decoder(src, device)
    names = model.linear_names()
    latent = {n: model.w[n].clone().requires_grad_(True) for n in names}
    teacher = lambda n: model.w[n]  # noqa: E731
    student = lambda n: straight_through(latent[n]) if n in latent else model.w[n]  # noqa: E731

    def score(label: str, linear) -> dict[str, float]:
        out = {part: perplexity(model, ids, args.eval_window, linear) for part, ids in scored.items()}
        log(f"{label}: perplexity " + ", ".join(f"{part} {v:.3f}" for part, v in out.items()))
        return out

    rtn = {n: int4_g128_round(model.w[n]) for n in names}
    scores = {"reference": score("reference", teacher), "round_to_nearest": score("round_to_nearest", lambda n: rtn[n])}
    del rtn

    optimizer = torch.optim.Adam(latent.values(), lr=args.lr)
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, 0.5 * (
        1 + math.cos(math.pi * min(1.0, max(0, s - warmup) / max(1, args.steps - warmup))))))
    generator = torch.Generator(device="cpu").manual_seed(args.seed)

    def window(tokens):
        start = int(torch.randint(0, tokens.numel() - args.length, (1,), generator=generator))
        return tokens[start:start + args.length]

    t_train, loss_avg = time.time(), None
    for step in range(args.steps):
        ids = torch.stack([window(train[i]) for i in torch.randint(0, len(train), (args.batch,), generator=generator)])
        with torch.no_grad():
            target = torch.log_softmax(model.logits(ids, teacher).float(), -1)
        logp = torch.log_softmax(model.logits(ids, student).float(), -1)
        loss = torch.nn.functional.kl_div(logp.flatten(0, 1), target.flatten(0, 1), log_target=True,
                                          reduction="batchmean")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        loss_avg = loss.item() if loss_avg is None else 0.95 * loss_avg + 0.05 * loss.item()
        if (step + 1) % max(1, args.steps // 20) == 0 or step + 1 == args.steps:
            elapsed = time.time() - t_train
            log(f"step {step + 1}/{args.steps}: KL {loss_avg:.4f}, lr {schedule.get_last_lr()[0]:.2e}, "
                f"{elapsed:.0f}s, ETA {elapsed / (step + 1) * (args.steps - step - 1):.0f}s")

    trained = {n: int4_g128_round(latent[n].detach()) for n in names}
    scores["calibrated"] = score("calibrated", lambda n: trained[n])

    method = (f"quantization-aware distillation: {args.steps} steps x {args.batch} x {args.length} tokens of "
              f"{described}, Adam lr {args.lr} cosine, KL to the unquantized model, seed {args.seed}")
    write_sidecar(model.reader, src, out, {n: latent[n].detach() for n in names}, method)
    line = {"tool": "calibrate_int4", "model": src.name, "sidecar": out.name, "method": method,
            "train_seconds": round(time.time() - t_train, 1), "device": torch.cuda.get_device_name(),
            **{f"ppl_{k}_{part}": round(v, 4) for k, s in scores.items() for part, v in s.items()}}
    for k in ("round_to_nearest", "calibrated"):
        deltas = {part: 100 * (scores[k][part] / scores["reference"][part] - 1) for part in scored}
        line.update({f"delta_pct_{k}_{part}": round(d, 3) for part, d in deltas.items()})
        validation = [d for part, d in deltas.items() if part.startswith("validation_")]
        line[f"delta_pct_{k}_validation_mean"] = round(sum(validation) / len(validation), 3)
    print(json.dumps(line), flush=True)
    if args.result:
        with open(args.result, "a") as f:
            f.write(json.dumps(line) + "\n")


def calibration_texts(args, eval_path: Path, held_out: int) -> tuple[dict[str, str], str]:
    """The texts to train on (name -> prose) and their description for the sidecar's method. The
    tuner's evaluation text, wherever it is among them, starts past --skip-chars."""
    default_dir = eval_path.parent.parent / "calibration-text"
    paths = [Path(p) for p in args.text] or [eval_path, *sorted(default_dir.glob("*.utf8"))]
    if not args.text and len(paths) == 1:
        log(f"{default_dir} has no .utf8 texts (scripts/fetch-models installs calibration-text): "
            f"training on {eval_path.name} alone")
    texts, described = {}, []
    for path in paths:
        if not path.is_file():
            fail(f"--text: {path} is not a file")
        if path.stem in texts:
            fail(f"--text: two texts are named {path.stem}")
        text = prose(path)
        if path.resolve() == eval_path.resolve():
            if args.skip_chars < held_out:
                fail(f"--skip-chars: {args.skip_chars} would train on the tuner's held-out text "
                     f"(its first {held_out} chars)")
            if args.skip_chars >= len(text):
                fail(f"--skip-chars: {args.skip_chars} is past the end of {path.name} ({len(text)} chars)")
            start = text.find("\n", args.skip_chars) + 1  # from the next whole line
            if start == 0:
                fail(f"--skip-chars: {path.name} has no line after char {args.skip_chars}")
            text = text[start:]
            described.append(f"{path.name} from char {start}")
        else:
            described.append(path.name)
        texts[path.stem] = text
    return texts, ", ".join(described) + (" (each sequence from one, chosen uniformly)" if len(texts) > 1 else "")


def gguf_writer_like(reader, path: Path):
    """A GGUFWriter to path holding all of reader's metadata (so a reader maps names and layouts alike)."""
    import gguf

    writer = gguf.GGUFWriter(path, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        writer.add_key_value(name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    return writer


def write_sidecar(reader, src: Path, out: Path, weights: dict, method: str) -> None:
    """The source's metadata (reader: src's, already open), the calibration keys, and each linear's
    latent weight in bf16."""
    import gguf
    import torch

    tmp = out.with_name(out.name + ".partial")
    writer = gguf_writer_like(reader, tmp)
    writer.add_string("tessera.calibration.format", "int4_g128")
    writer.add_string("tessera.calibration.source_sha256", sha256(src))
    writer.add_string("tessera.calibration.method", method)
    for name, w in weights.items():
        bits = w.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
        writer.add_tensor(name, bits, raw_shape=bits.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)  # whole or not at all: the server must never read half a sidecar
    log(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {len(weights)} linears)")


if __name__ == "__main__":
    main()
