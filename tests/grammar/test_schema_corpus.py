"""Every output the grammar engine lets through for the schema corpus is valid JSON that validates
against its schema (jsonschema, Draft 2020-12, with the format checks jsonschema can make).

tessera-grammar-bench walks each compiled schema with a seeded random model over SmolLM2's 49k
vocabulary and writes the decoded outputs; this test reads them back. Skips when jsonschema or the
model is absent.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

jsonschema = pytest.importorskip("jsonschema")

HERE = pathlib.Path(__file__).resolve().parent
MODEL_DIR = pathlib.Path(os.environ.get("TESSERA_MODEL_DIR", pathlib.Path.home() / ".cache/tessera/models"))
SMOLLM2 = MODEL_DIR / "smollm2-135m-instruct"


def test_every_walk_of_the_corpus_validates(tmp_path):
    bench = os.environ.get("TESSERA_GRAMMAR_BENCH")
    if not bench:
        pytest.skip("TESSERA_GRAMMAR_BENCH (tessera-grammar-bench) is not set")
    if not SMOLLM2.exists():
        pytest.skip(f"{SMOLLM2} is absent (scripts/fetch-models)")
    corpus_path, outputs_path = tmp_path / "corpus.jsonl", tmp_path / "outputs.jsonl"
    subprocess.run([sys.executable, str(HERE / "make_schema_corpus.py"), str(corpus_path)], check=True)
    subprocess.run([bench, "--corpus", str(corpus_path), "--tokenizer", str(SMOLLM2),
                    "--outputs", str(outputs_path)], check=True, stdout=subprocess.DEVNULL)

    schemas = {e["name"]: e["schema"] for e in map(json.loads, corpus_path.read_text().splitlines())}
    outputs = [json.loads(line) for line in outputs_path.read_text().splitlines()]
    assert len(schemas) >= 200
    assert [o["name"] for o in outputs] == list(schemas)
    failures = []
    for out in outputs:
        schema = schemas[out["name"]]
        if not out["terminated"]:
            failures.append(f"{out['name']}: not terminated after {out['steps']} tokens")
            continue
        try:
            value = json.loads(out["output"])
            jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator,
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{out['name']}: {out['output']!r}: {str(e).splitlines()[0]}")
    assert not failures, f"{len(failures)} of {len(outputs)} outputs invalid:\n" + "\n".join(failures[:20])
