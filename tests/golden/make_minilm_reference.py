#!/usr/bin/env python3
"""Reference sentence embeddings for all-MiniLM-L6-v2 from sentence-transformers (mean pooling,
L2 normalisation as the model's modules.json configures), for 20 fixed sentences. Writes
tests/golden/minilm_reference.json. Run with /opt/fxvenv/bin/python:
    /opt/fxvenv/bin/python tests/golden/make_minilm_reference.py [path/to/all-minilm-l6-v2]
"""
import json
import os
import sys

from sentence_transformers import SentenceTransformer

HERE = os.path.dirname(os.path.abspath(__file__))
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The cat sits on the mat.",
    "How do I reset my password?",
    "I forgot my password and need to change it.",
    "The stock market fell sharply on Monday.",
    "Quantum computers use qubits instead of bits.",
    "Paris is the capital of France.",
    "",
    "UPPER and lower CASE, punctuation!? and numbers 12345.",
    "Naïve café résumé — unicode accents and dashes.",
    "短い日本語の文です。",
    "a " * 300,  # longer than max_seq_length (256): truncated
]


def find_model():
    if len(sys.argv) > 1:
        return sys.argv[1]
    roots = [os.environ.get("TESSERA_MODEL_DIR"), os.path.expanduser("~/.cache/tessera/models"), "/tmp/models-test"]
    for root in filter(None, roots):
        path = os.path.join(root, "all-minilm-l6-v2")
        if os.path.exists(os.path.join(path, "config.json")):
            return path
    sys.exit("cannot find all-minilm-l6-v2; pass its folder")


def main():
    model = SentenceTransformer(find_model(), device="cpu")
    embeddings = model.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=False)
    out = {"model": "all-minilm-l6-v2", "made_by": "tests/golden/make_minilm_reference.py",
           "max_seq_length": model.max_seq_length,
           "sentences": [{"text": s, "embedding": [float(f"{v:.8g}") for v in e]} for s, e in zip(SENTENCES, embeddings)]}
    with open(os.path.join(HERE, "minilm_reference.json"), "w") as f:
        json.dump(out, f)
    print(f"wrote {len(SENTENCES)} embeddings of dim {embeddings.shape[1]}")


if __name__ == "__main__":
    main()
