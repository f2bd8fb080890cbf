#!/usr/bin/env python3
"""Makes the golden fixtures: tiny random-weight Llama (GQA, tied embeddings, llama3 rope scaling),
Mistral (sliding_window 16, 64-token prompts so the window matters) and BERT (mean pooling +
L2 normalisation via sentence-transformers files) models as safetensors + config.json, with
reference logits / hidden states from transformers in reference.json.

Run with transformers + torch (not needed on CI; the fixtures are committed):
    /opt/fxvenv/bin/python tests/golden/make_fixtures.py
Each fixture file stays under 1 MiB.
"""
import json
import os
import sys

import torch
import transformers
from transformers import (BertConfig, BertModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
MAX_FILE_BYTES = 1 << 20


def floats(t):
    return [float(f"{v:.9g}") for v in t.detach().to(torch.float32).reshape(-1).tolist()]


def randomize(model, seed, std=0.2):
    # transformers' init (std 0.02) gives near-uniform logits; a wider init makes every op matter.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))


def save(model, name, reference, extra_files=None):
    path = os.path.join(OUT, name)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    legacy_rope_layout(os.path.join(path, "config.json"))
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(reference, f)
    for rel, content in (extra_files or {}).items():
        os.makedirs(os.path.dirname(os.path.join(path, rel)) or path, exist_ok=True)
        with open(os.path.join(path, rel), "w") as f:
            json.dump(content, f, indent=1)
    for root, _, files in os.walk(path):
        for fn in files:
            size = os.path.getsize(os.path.join(root, fn))
            if size > MAX_FILE_BYTES:
                sys.exit(f"{name}/{fn} is {size} bytes, over the 1 MiB fixture limit")
    print(f"wrote {path}")


def legacy_rope_layout(config_path):
    # transformers 5 writes "rope_parameters"; checkpoints in the wild (and the configs Tessera reads)
    # use the 4.x layout: a top-level rope_theta and an optional rope_scaling object.
    with open(config_path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters", None)
    if rope is not None:
        cfg["rope_theta"] = rope.pop("rope_theta")
        if rope.get("rope_type", "default") != "default":
            cfg["rope_scaling"] = rope
    with open(config_path, "w") as f:
        json.dump(cfg, f, indent=2)


def causal_reference(model, prompts):
    out = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0]
            out.append({"ids": ids, "logits": floats(logits), "shape": list(logits.shape)})
    return out


def make_llama():
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    randomize(model, 1)
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (7, 13, 40)]
    save(model, "tiny-llama", {"model": "tiny-llama", "prompts": causal_reference(model, prompts)})


def make_mistral():
    cfg = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                        max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                        sliding_window=16, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = "eager"  # sdpa may skip the window; eager applies it
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).eval()
    assert model.config._attn_implementation == "eager"
    randomize(model, 3)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 128, (64,), generator=g).tolist() for _ in range(2)]
    reference = causal_reference(model, prompts)
    # The same weights without the window: the test checks that the window changes the logits.
    model.config.sliding_window = None
    for layer in model.model.layers:
        layer.self_attn.sliding_window = None
    no_window = causal_reference(model, prompts[:1])
    model.config.sliding_window = 16
    diff = max(abs(a - b) for a, b in zip(reference[0]["logits"], no_window[0]["logits"]))
    assert diff > 1e-2, f"the window does not change the logits (max diff {diff})"
    save(model, "tiny-mistral", {"model": "tiny-mistral", "prompts": reference,
                                 "no_window_max_abs_diff": diff})


def make_bert():
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
                     layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = BertModel(cfg, add_pooling_layer=False).eval()
    randomize(model, 5)
    g = torch.Generator().manual_seed(6)
    inputs = []
    for n, split in ((9, None), (17, 11), (5, None)):
        ids = torch.randint(1, 100, (n,), generator=g).tolist()
        types = [0] * n if split is None else [0] * split + [1] * (n - split)
        inputs.append((ids, types))
    refs = []
    with torch.no_grad():
        for ids, types in inputs:
            hidden = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).last_hidden_state[0]
            pooled = torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)
            refs.append({"ids": ids, "token_type_ids": types, "hidden": floats(hidden),
                         "shape": list(hidden.shape), "embedding": floats(pooled)})
    st = {"modules.json": [
              {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
              {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
          "1_Pooling/config.json": {"word_embedding_dimension": 32, "pooling_mode_cls_token": False,
                                    "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                                    "pooling_mode_mean_sqrt_len_tokens": False}}
    save(model, "tiny-bert", {"model": "tiny-bert", "inputs": refs}, st)


if __name__ == "__main__":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    make_llama()
    make_mistral()
    make_bert()
