"""tests/integration/pad_attention_heads.py: writes a copy of a Llama GGUF whose attention has zero
heads appended, so that its heads and KV heads divide by a tensor-parallel size. The copy computes
the same logits: a zero head's query, key and value rows are zero, so its output is zero, and its
o_proj columns are zero too. The new heads come as whole new KV groups, so every original head keeps
its KV head.

It lets the integration suite, which serves SmolLM2-135M (9 heads, 3 KV heads), run against
`tessera serve --tensor-parallel 2` with the same model, padded to 12 heads and 4 KV heads.

Needs the `gguf` package (scripts/setup installs it; on the GPU machine, llama.cpp's gguf-py on
PYTHONPATH) and numpy:
  python3 tests/integration/pad_attention_heads.py IN.gguf OUT.gguf --ranks 2
"""

from __future__ import annotations

import argparse

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

SKIPPED_KEYS = ("GGUF.", "general.architecture")


def padded_counts(heads: int, kv_heads: int, ranks: int) -> tuple[int, int]:
    """The fewest heads and KV heads, the same number of heads per KV head, that divide by `ranks`."""
    group = heads // kv_heads
    kv = kv_heads
    while kv % ranks != 0 or (kv * group) % ranks != 0:
        kv += 1
    return kv * group, kv


def row_bytes(tensor_type: GGMLQuantizationType, values: int) -> int:
    block, size = GGML_QUANT_SIZES[tensor_type]
    if values % block != 0:
        raise SystemExit(f"{values} values do not fill whole {tensor_type.name} blocks of {block}")
    return values // block * size


def rows_of(tensor) -> np.ndarray:
    """The tensor's bytes as [rows, bytes of a row], or 1-D for a vector (every ggml type decodes
    all-zero bytes as 0, so zero bytes pad with zeros)."""
    data = np.ascontiguousarray(tensor.data).view(np.uint8)
    return data.reshape(int(tensor.shape[-1]), -1) if len(tensor.shape) > 1 else data.reshape(-1)


def with_rows(tensor, extra_rows: int) -> np.ndarray:
    rows = rows_of(tensor)
    return np.concatenate([rows, np.zeros((extra_rows, rows.shape[1]), np.uint8)])


def with_columns(tensor, extra_columns: int) -> np.ndarray:
    rows = rows_of(tensor)
    pad = row_bytes(tensor.tensor_type, extra_columns)
    return np.concatenate([rows, np.zeros((rows.shape[0], pad), np.uint8)], axis=1)


def copy_fields(reader: GGUFReader, writer: GGUFWriter, arch: str, heads: int, kv_heads: int, head_dim: int) -> None:
    replaced = {f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": kv_heads,
                f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim}
    for key, field in reader.fields.items():
        if key.startswith(SKIPPED_KEYS) or key in replaced:
            continue
        main = GGUFValueType(field.types[0])
        sub = GGUFValueType(field.types[-1]) if main == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), main, sub_type=sub)
    for key, value in replaced.items():
        writer.add_key_value(key, value, GGUFValueType.UINT32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("--ranks", type=int, default=2, help="the tensor-parallel size to divide by")
    args = parser.parse_args()

    reader = GGUFReader(args.source)
    arch = reader.fields["general.architecture"].contents()
    heads = int(reader.fields[f"{arch}.attention.head_count"].contents())
    kv_heads = int(reader.fields[f"{arch}.attention.head_count_kv"].contents())
    hidden = int(reader.fields[f"{arch}.embedding_length"].contents())
    key_length = reader.fields.get(f"{arch}.attention.key_length")
    head_dim = int(key_length.contents()) if key_length else hidden // heads
    new_heads, new_kv = padded_counts(heads, kv_heads, args.ranks)
    print(f"heads {heads} -> {new_heads}, KV heads {kv_heads} -> {new_kv}, head_dim {head_dim}")

    writer = GGUFWriter(args.target, arch)
    copy_fields(reader, writer, arch, new_heads, new_kv, head_dim)
    extra = {"attn_q": (new_heads - heads) * head_dim, "attn_k": (new_kv - kv_heads) * head_dim,
             "attn_v": (new_kv - kv_heads) * head_dim}
    for tensor in reader.tensors:
        kind = tensor.name.split(".")[-2]
        if kind in extra and len(tensor.shape) == 2:
            data = with_rows(tensor, extra[kind])
        elif kind in extra:
            raise SystemExit(f"{tensor.name}: attention biases are not padded")
        elif kind == "attn_output":
            data = with_columns(tensor, (new_heads - heads) * head_dim)
        else:
            data = rows_of(tensor)
        # uint8 rows with the ggml type: the writer derives the shape in values from the bytes.
        writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
