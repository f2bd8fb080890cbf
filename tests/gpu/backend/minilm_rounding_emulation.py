#!/usr/bin/env python3
"""How close to the fp32 embeddings can all-MiniLM-L6-v2 get in bf16 or fp16, and which rounding
points cost what. The tolerances in test_cuda_bert.cpp rest on this emulation.

MiniLM runs in numpy fp32, with each rounding point of the CUDA backend switched on or off:
  linear_weights  the GEMM weight matrices stored in the dtype
  small_params    embedding tables, biases, LayerNorm weights stored in the dtype
  embedding_sums  the word + position + type sums written to the activation buffer
  gemm_inputs     activations rounded as they enter a GEMM (tensor cores take only the dtype)
  gemm_outputs    GEMM outputs (q, k, v, attention out, intermediate, FFN out)
  residual        the LayerNorm outputs, which are the residual stream
  probabilities   attention probabilities before P·V
Each configuration prints one JSON line: 1 - cosine to the exact fp32 embedding per text, and the
worst. Usage: minilm_rounding_emulation.py [--dtype bf16|fp16] [--model DIR] [text ...]
"""
import argparse
import json
import math
import os
import struct

import numpy as np
from tokenizers import Tokenizer

POINTS = ("linear_weights", "small_params", "embedding_sums", "gemm_inputs", "gemm_outputs", "residual",
          "probabilities")
LINEAR_SUFFIXES = ("query.weight", "key.weight", "value.weight", "dense.weight")
DEFAULT_TEXTS = ["no", "?!", "?", "!", "x", "...", "a", "Paris", "The quiet river crossed the engine near the museum.",
                 "def f(x):\n    return x ** 2  # square", "東京は日本の首都で、人口は約1400万人です。"]


def load_safetensors_f32(path):
    raw = open(path, "rb").read()
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + header_len])
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        begin, end = meta["data_offsets"]
        data = raw[8 + header_len + begin:8 + header_len + end]
        tensors[name] = np.frombuffer(data, dtype=np.float32).reshape(meta["shape"])
    return tensors


def round_bf16(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # round to nearest even
    return bits.astype(np.uint32).view(np.float32)


def round_fp16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def exact(x):
    return np.asarray(x, dtype=np.float32)


ERF = np.vectorize(math.erf, otypes=[np.float32])


def layer_norm(x, w, b, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


class MiniLM:
    def __init__(self, model_dir):
        self.tensors = load_safetensors_f32(os.path.join(model_dir, "model.safetensors"))
        self.prefix = "" if "embeddings.word_embeddings.weight" in self.tensors else "bert."
        config = json.load(open(os.path.join(model_dir, "config.json")))
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.hidden = config["hidden_size"]

    def embed(self, ids, rounding):
        """Mean-pooled, L2-normalised embedding; rounding maps each point to a rounding function."""
        r = rounding

        def w(name):
            point = "linear_weights" if name.endswith(LINEAR_SUFFIXES) else "small_params"
            return r[point](self.tensors[self.prefix + name])

        n, h, heads = len(ids), self.hidden, self.heads
        d = h // heads
        x = r["embedding_sums"](w("embeddings.word_embeddings.weight")[ids] + w("embeddings.position_embeddings.weight")[:n])
        x = r["embedding_sums"](x + w("embeddings.token_type_embeddings.weight")[0])
        hidden = r["residual"](layer_norm(x, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias")))
        for layer in range(self.layers):
            p = f"encoder.layer.{layer}."
            a = r["gemm_inputs"](hidden)
            q, k, v = (r["gemm_outputs"](a @ w(p + f"attention.self.{m}.weight").T + w(p + f"attention.self.{m}.bias"))
                       .reshape(n, heads, d).transpose(1, 0, 2) for m in ("query", "key", "value"))
            s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
            s = np.exp(s - s.max(-1, keepdims=True))
            o = (r["probabilities"](s) @ v) / s.sum(-1, keepdims=True)
            o = r["gemm_inputs"](o.transpose(1, 0, 2).reshape(n, h))
            attn_out = r["gemm_outputs"](o @ w(p + "attention.output.dense.weight").T + w(p + "attention.output.dense.bias"))
            hidden = r["residual"](layer_norm(attn_out + hidden, w(p + "attention.output.LayerNorm.weight"),
                                              w(p + "attention.output.LayerNorm.bias")))
            inter = r["gemm_outputs"](r["gemm_inputs"](hidden) @ w(p + "intermediate.dense.weight").T +
                                      w(p + "intermediate.dense.bias"))
            inter = r["gemm_inputs"](0.5 * inter * (1 + ERF(inter / np.sqrt(2))))
            ffn_out = r["gemm_outputs"](inter @ w(p + "output.dense.weight").T + w(p + "output.dense.bias"))
            hidden = r["residual"](layer_norm(ffn_out + hidden, w(p + "output.LayerNorm.weight"),
                                              w(p + "output.LayerNorm.bias")))
        pooled = hidden.mean(0)
        return pooled / np.linalg.norm(pooled)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--model", default=os.path.join(
        os.environ.get("TESSERA_MODEL_DIR", os.path.expanduser("~/.cache/tessera/models")), "all-minilm-l6-v2"))
    parser.add_argument("texts", nargs="*", default=DEFAULT_TEXTS)
    args = parser.parse_args()
    rnd = round_bf16 if args.dtype == "bf16" else round_fp16
    model = MiniLM(args.model)
    tokenizer = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    inputs = [tokenizer.encode(t).ids[:256] for t in args.texts]
    reference = [model.embed(ids, {p: exact for p in POINTS}) for ids in inputs]

    every_point = {p: rnd for p in POINTS}
    configurations = {
        "every point (the CUDA backend)": every_point,
        "small params, embedding sums and residual exact": {**every_point, "small_params": exact,
                                                            "embedding_sums": exact, "residual": exact},
        "only linear weights and GEMM inputs rounded": {**{p: exact for p in POINTS},
                                                        "linear_weights": rnd, "gemm_inputs": rnd},
        "only linear weights rounded": {**{p: exact for p in POINTS}, "linear_weights": rnd},
    }
    for name, rounding in configurations.items():
        gaps = [1.0 - float(ref @ model.embed(ids, rounding)) for ids, ref in zip(inputs, reference)]
        print(json.dumps({"dtype": args.dtype, "configuration": name, "worst_1_minus_cos": max(gaps),
                          "mean_1_minus_cos": float(np.mean(gaps)),
                          "per_text": {t[:24]: g for t, g in zip(args.texts, gaps)}}, ensure_ascii=False))


if __name__ == "__main__":
    main()
