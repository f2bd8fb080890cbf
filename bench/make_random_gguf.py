#!/usr/bin/env python3
"""Write a Llama-shaped GGUF with random F16/BF16 weights, for benchmarking without real weights.

Serving speed depends on the model's shape, not on its values, so a file with the shape of a
7B model lets `tessera serve` and llama.cpp's llama-server be measured on a GPU machine where no
7B weights exist. The shape comes from a HF config.json; the tokenizer and chat template are
copied from an existing GGUF, whose vocabulary size replaces the config's vocab_size (the
embedding and lm_head rows must match the tokenizer). Output is gibberish, but finite.

Example (7B shape, SmolLM2's tokenizer; ~13.5 GB):
    python3 bench/make_random_gguf.py --config configs/tune/llama2-7b-shape/config.json \
        --tokenizer-from ~/.cache/tessera/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out /tmp/llama2-7b-shape-f16.gguf

Needs only numpy and the `gguf` package (gguf-py from llama.cpp).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import gguf

# One block of random values is reused for every tensor (each starts at its own offset in it):
# generating 6.7B fresh normals would dominate the run time, and only the shape matters.
POOL_VALUES = 64 * 1024 * 1024
WEIGHT_STD = 0.02  # HF's initializer_range: keeps fp16 activations far from overflow
CHUNK_BYTES = 64 * 1024 * 1024


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, type=Path, help="HF config.json giving the Llama shape")
    p.add_argument("--tokenizer-from", required=True, type=Path, help="GGUF whose tokenizer.* metadata is copied")
    p.add_argument("--out", required=True, type=Path, help="GGUF file to write")
    p.add_argument("--dtype", choices=["f16", "bf16"], default="f16", help="type of the 2-D weights (norms are F32)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def read_tokenizer_fields(path):
    """(key, value, type, sub_type) of every tokenizer.* field in the GGUF at `path`."""
    reader = gguf.GGUFReader(path)
    fields = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        fields.append((key, field.contents(), vtype, sub_type))
    return fields


def vocab_size_of(tokenizer_fields):
    for key, value, _, _ in tokenizer_fields:
        if key == "tokenizer.ggml.tokens":
            return len(value)
    sys.exit("error: the tokenizer GGUF has no tokenizer.ggml.tokens")


def llama_shape(config, vocab_size):
    """The dimensions the writer needs, from a HF Llama config.json."""
    heads = config["num_attention_heads"]
    return {
        "vocab": vocab_size,
        "hidden": config["hidden_size"],
        "inter": config["intermediate_size"],
        "layers": config["num_hidden_layers"],
        "heads": heads,
        "kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
        "context": config.get("max_position_embeddings", 4096),
        "eps": config.get("rms_norm_eps", 1e-5),
        "rope_theta": config.get("rope_theta") or 10000.0,
        "tied": config.get("tie_word_embeddings", False),
    }


def tensor_plan(s):
    """(name, numpy-order shape, is_norm) for every tensor, in file order; shapes are [out, in]."""
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    plan = [("token_embd.weight", (s["vocab"], h), False)]
    for i in range(s["layers"]):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (h,), True),
            # llama.cpp permutes attn_q/attn_k rows for its RoPE layout; irrelevant for random values.
            (b + "attn_q.weight", (q, h), False),
            (b + "attn_k.weight", (kv, h), False),
            (b + "attn_v.weight", (kv, h), False),
            (b + "attn_output.weight", (h, q), False),
            (b + "ffn_norm.weight", (h,), True),
            (b + "ffn_gate.weight", (s["inter"], h), False),
            (b + "ffn_up.weight", (s["inter"], h), False),
            (b + "ffn_down.weight", (h, s["inter"]), False),
        ]
    plan.append(("output_norm.weight", (h,), True))
    if not s["tied"]:  # no output.weight means tied embeddings to llama.cpp and Tessera
        plan.append(("output.weight", (s["vocab"], h), False))
    return plan


def add_metadata(writer, s, dtype, name, tokenizer_fields):
    writer.add_name(name)
    writer.add_type("model")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if dtype == "bf16" else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(s["vocab"])
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["inter"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_layer_norm_rms_eps(s["eps"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_rope_dimension_count(s["head_dim"])
    # Explicit, for configs whose head_dim is not hidden / heads (both readers assume that otherwise).
    writer.add_key_length(s["head_dim"])
    writer.add_value_length(s["head_dim"])
    for key, value, vtype, sub_type in tokenizer_fields:
        writer.add_key_value(key, value, vtype, sub_type)


def random_pool(count, dtype, seed):
    """`count` normals * WEIGHT_STD as raw little-endian bytes of the 2-D weight type."""
    values = np.random.default_rng(seed).standard_normal(count, dtype=np.float32)
    values *= WEIGHT_STD
    if dtype == "bf16":
        return (values.view(np.uint32) >> 16).astype("<u2").tobytes()  # truncation is fine here
    return values.astype("<f2").tobytes()


def write_repeating(f, pool, start, nbytes):
    """Writes `nbytes` of `pool` from byte `start`, wrapping around, in chunks (no big copies)."""
    view = memoryview(pool)
    pos = start
    while nbytes > 0:
        n = min(nbytes, len(pool) - pos, CHUNK_BYTES)
        f.write(view[pos:pos + n])
        nbytes -= n
        pos = (pos + n) % len(pool)


def pad_to(f, alignment):
    f.write(b"\0" * (-f.tell() % alignment))


def main():
    args = parse_args()
    t0 = time.time()
    tokenizer_fields = read_tokenizer_fields(args.tokenizer_from)
    shape = llama_shape(json.loads(args.config.read_text()), vocab_size_of(tokenizer_fields))
    plan = tensor_plan(shape)

    elem_bytes = 2
    raw_type = gguf.GGMLQuantizationType.BF16 if args.dtype == "bf16" else gguf.GGMLQuantizationType.F16
    writer = gguf.GGUFWriter(args.out, "llama")
    add_metadata(writer, shape, args.dtype, args.out.stem, tokenizer_fields)
    for name, dims, is_norm in plan:
        count = int(np.prod(dims))
        if is_norm:  # llama.cpp keeps 1-D tensors in F32
            writer.add_tensor_info(name, dims, np.dtype(np.float32), count * 4)
        else:
            writer.add_tensor_info(name, dims, np.dtype(np.uint16), count * elem_bytes, raw_dtype=raw_type)
    # GGUFWriter writes the header and tensor infos (their offsets assume each tensor padded to the
    # alignment); the data section is then appended here, streamed from the pool.
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    alignment = writer.data_alignment
    writer.close()

    pool_values = min(POOL_VALUES, max(int(np.prod(dims)) for _, dims, _ in plan))  # small shapes: small pool
    pool = random_pool(pool_values, args.dtype, args.seed)
    offsets = np.random.default_rng(args.seed + 1).integers(0, pool_values, len(plan)) * elem_bytes
    total = 0
    with open(args.out, "ab") as f:
        pad_to(f, alignment)
        for (name, dims, is_norm), start in zip(plan, offsets):
            count = int(np.prod(dims))
            if is_norm:
                f.write(np.ones(count, dtype="<f4").tobytes())  # RMSNorm scale 1: activations keep their size
            else:
                write_repeating(f, pool, int(start), count * elem_bytes)
            total += count
            pad_to(f, alignment)
    size = args.out.stat().st_size
    print(f"wrote {args.out}: {len(plan)} tensors, {total / 1e9:.2f}B params, {size / 1e9:.2f} GB, "
          f"vocab {shape['vocab']}, {args.dtype}, in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
