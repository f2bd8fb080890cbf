#!/usr/bin/env python3
"""Writes tests/unit/weights/data/smollm2_reference.json: a few rows of SmolLM2-135M-Instruct
(Q4_1 GGUF) dequantized by the pip `gguf` package, with llama.cpp's RoPE row permutation of
attn_q / attn_k undone in numpy, under HF names. weights_test compares Tessera's reader against it.

Usage: make_gguf_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf] [out.json]
(default: $TESSERA_MODEL_DIR or ~/.cache/tessera/models, folder smollm2-135m-instruct).
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def default_model():
    model_dir = os.environ.get("TESSERA_MODEL_DIR") or os.path.expanduser("~/.cache/tessera/models")
    return os.path.join(model_dir, "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf's permute, which did on HF rows:
    w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else default_model()
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "data", "smollm2_reference.json")
    reader = GGUFReader(path)
    field = lambda key: reader.fields[key].parts[reader.fields[key].data[0]][0]
    n_head = int(field("llama.attention.head_count"))
    n_head_kv = int(field("llama.attention.head_count_kv"))
    tensors = {t.name: t for t in reader.tensors}

    # (gguf name, HF name, rows to keep, heads to unpermute with or None)
    picks = [
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", [0, 1, 2, 31, 32, 33, 63, 64, 97, 575], n_head),
        ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", [0, 1, 31, 32, 63, 64, 100, 191], n_head_kv),
        ("blk.29.attn_k.weight", "model.layers.29.self_attn.k_proj.weight", [0, 1, 32, 190], n_head_kv),
        ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight", [0, 1, 32], None),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight", [0, 575], None),
        ("token_embd.weight", "model.embed_tokens.weight", [0, 1, 49151], None),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight", None, None),
        ("output_norm.weight", "model.norm.weight", None, None),
    ]
    out = {"source": os.path.basename(path), "tensors": []}
    for gguf_name, hf_name, rows, heads in picks:
        t = tensors[gguf_name]
        hf_shape = [int(d) for d in reversed(t.shape.tolist())]  # GGUF ne0 is the HF last dim
        w = dequantize(t.data, t.tensor_type).reshape(hf_shape).astype(np.float32)
        if heads is not None:
            w = unpermute(w, heads)
        entry = {"name": hf_name, "shape": hf_shape, "dtype": t.tensor_type.name}
        if rows is None:
            entry["values"] = [float(x) for x in w.reshape(-1)]
        else:
            entry["rows"] = {str(r): [float(x) for x in w[r]] for r in rows}
        out["tensors"].append(entry)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)")


if __name__ == "__main__":
    main()
