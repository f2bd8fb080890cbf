"""The JSON-schema corpus (tests/grammar/make_schema_corpus.py) through a real `tessera serve` and
SmolLM2: each schema as a chat response_format, greedy with a frequency penalty (without one, the
135M model loops inside half the unbounded arrays and strings until max_tokens). Every answer that ends with "stop" parses
and validates against its schema (jsonschema, format checks on); an answer that reaches max_tokens
inside the value ends with "length", as the peers' do, and is counted. The CPU run takes the first
TESSERA_SCHEMA_CORPUS_LIMIT schemas (default 16); the CUDA run (TESSERA_TEST_BACKEND=cuda) takes the
whole corpus unless the variable says otherwise."""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
from pathlib import Path

import jsonschema
import pytest

import serving

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grammar"))
import make_schema_corpus  # noqa: E402

MAX_TOKENS = 320
# The test server's context is 1,024 tokens: a schema longer than this (as compact JSON) is left out
# of the prompt; the grammar holds the answer to it all the same.
PROMPT_SCHEMA_CHARS = 1200


def corpus_limit() -> int:
    default = "0" if os.environ.get("TESSERA_TEST_BACKEND") == "cuda" else "16"
    return int(os.environ.get("TESSERA_SCHEMA_CORPUS_LIMIT", default))


def answer(client, entry):
    schema = entry["schema"]
    text = json.dumps(schema, separators=(",", ":"))
    prompt = "Write one JSON value for this JSON schema:\n" + text if len(text) <= PROMPT_SCHEMA_CHARS else \
        "Write one JSON value."
    r = client.chat.completions.create(
        model=serving.LLM, max_tokens=MAX_TOKENS, temperature=0, frequency_penalty=1.0,
        messages=[{"role": "user", "content": prompt}],
        response_format={"type": "json_schema", "json_schema": {"name": "corpus", "schema": schema, "strict": True}})
    return entry["name"], schema, r.choices[0].finish_reason, r.choices[0].message.content


def test_corpus_outputs_validate(client):
    entries = make_schema_corpus.corpus()
    if corpus_limit() > 0:
        entries = entries[:corpus_limit()]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda e: answer(client, e), entries))
    invalid, truncated = [], []
    for name, schema, finish, text in results:
        if finish == "length":
            truncated.append(name)
            continue
        assert finish == "stop", (name, finish)
        try:
            # The draft's own format checker: FormatChecker() checks "time" as draft 3 did (no
            # fractions, no offset).
            jsonschema.validate(json.loads(text), schema, cls=jsonschema.Draft202012Validator,
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        except (ValueError, jsonschema.ValidationError) as e:
            invalid.append((name, str(e)[:200], text[:200]))
    print(f"schema corpus: {len(results)} schemas, {len(results) - len(truncated) - len(invalid)} valid, "
          f"{len(invalid)} invalid, {len(truncated)} reached max_tokens ({MAX_TOKENS})")
    assert not invalid, invalid[:5]
    assert len(truncated) <= len(results) // 4, f"too many answers cut by max_tokens: {truncated}"
