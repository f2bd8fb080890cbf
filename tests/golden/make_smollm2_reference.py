#!/usr/bin/env python3
"""Reference greedy continuations for SmolLM2-135M-Instruct (GGUF Q4_1), from transformers'
LlamaForCausalLM running on the SAME dequantized weights Tessera loads:

  1. read the GGUF with the `gguf` package and dequantize every tensor to fp32;
  2. undo llama.cpp's RoPE row permutation of attn_q / attn_k (convert_hf_to_gguf permutes rows so
     its kernels can rotate adjacent pairs; HF's rotate_half wants the halves);
  3. build the HF model from the GGUF metadata, fp32, eager attention;
  4. greedy-generate 32 tokens for 5 fixed prompts (token ids from transformers' GGUF tokenizer).

Writes tests/golden/smollm2_reference.json. Run with /opt/fxvenv/bin/python (torch, transformers, gguf):
    /opt/fxvenv/bin/python tests/golden/make_smollm2_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json
import os
import sys

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEW_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
]


def find_gguf():
    if len(sys.argv) > 1:
        return sys.argv[1]
    roots = [os.environ.get("TESSERA_MODEL_DIR"), os.path.expanduser("~/.cache/tessera/models"), "/tmp/models-test"]
    for root in filter(None, roots):
        path = os.path.join(root, "smollm2-135m-instruct", GGUF_NAME)
        if os.path.exists(path):
            return path
    sys.exit(f"cannot find {GGUF_NAME}; pass its path")


def field(reader, key):
    f = reader.fields[key]
    value = f.parts[f.data[0]]
    if f.types and f.types[0].name == "STRING":
        return bytes(value).decode()
    return value.tolist()[0]


def unpermute(w, n_head):
    # Inverse of llama.cpp's permute(): reshape(n_head, 2, d/2, ...).swapaxes(1, 2).
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    path = find_gguf()
    reader = GGUFReader(path)
    arch = field(reader, "general.architecture")
    assert arch == "llama", arch
    n_head = field(reader, "llama.attention.head_count")
    n_kv = field(reader, "llama.attention.head_count_kv")
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists ne0 first
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_kv)
        tensors[t.name] = w

    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state = {}
    for name, w in tensors.items():
        if name in names:
            state[names[name]] = torch.from_numpy(w)
            continue
        _, layer, kind, _ = name.split(".")
        state[f"model.layers.{layer}.{per_layer[kind]}.weight"] = torch.from_numpy(w)

    tied = "lm_head.weight" not in state
    vocab = state["model.embed_tokens.weight"].shape[0]
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=field(reader, "llama.embedding_length"),
        intermediate_size=field(reader, "llama.feed_forward_length"),
        num_hidden_layers=field(reader, "llama.block_count"),
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        max_position_embeddings=field(reader, "llama.context_length"),
        rms_norm_eps=field(reader, "llama.attention.layer_norm_rms_epsilon"),
        rope_theta=field(reader, "llama.rope.freq_base"),
        tie_word_embeddings=tied,
    )
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (tied and m == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    if tied:
        model.tie_weights()

    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    results = []
    with torch.no_grad():
        for text in PROMPTS:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            seq = list(ids)
            margins = []
            # Plain greedy loop over transformers' KV cache: no generation-config surprises.
            out = model(torch.tensor([seq]), use_cache=True)
            for _ in range(NEW_TOKENS):
                logits = out.logits[0, -1]
                top2 = torch.topk(logits, 2)
                margins.append(float(top2.values[0] - top2.values[1]))
                seq.append(int(torch.argmax(logits)))
                out = model(torch.tensor([[seq[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            results.append({"prompt": text, "prompt_ids": ids, "generated_ids": seq[len(ids):],
                            "min_top2_margin": min(margins),
                            "text": tokenizer.decode(seq[len(ids):])})
            print(repr(text), "->", repr(results[-1]["text"]), f"(min top-2 margin {min(margins):.4f})")
    out = {"model": "smollm2-135m-instruct", "gguf": GGUF_NAME, "new_tokens": NEW_TOKENS,
           "made_by": "tests/golden/make_smollm2_reference.py", "prompts": results}
    with open(os.path.join(HERE, "smollm2_reference.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
