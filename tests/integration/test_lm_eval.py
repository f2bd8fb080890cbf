"""lm-evaluation-harness end to end: `lm_eval --model local-completions` with
`tokenizer_backend=remote` against `tessera serve`. The remote tokenizer reads /tokenizer_info and
calls /tokenize and /detokenize; log-likelihoods come from /v1/completions with echo and logprobs.
The task is a tiny multiple-choice set in a local JSONL file, so nothing comes from the network.
Skipped when lm_eval is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import serving

pytest.importorskip("lm_eval")

DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " Berlin", " Madrid"], "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " seven", " ten"], "answer": 0},
    {"question": "The colour of the clear sky is", "choices": [" green", " blue", " purple"], "answer": 1},
    {"question": "Water freezes at zero degrees", "choices": [" Kelvin", " Celsius", " Rankine"], "answer": 1},
]


def write_task(directory) -> None:
    data = directory / "tiny.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (directory / "tessera_tiny.yaml").write_text(textwrap.dedent(f"""\
        task: tessera_tiny
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {data}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "{{{{question}}}}"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: "{{{{answer}}}}"
        metric_list:
          - metric: acc
        """))


def test_lm_eval_local_completions_with_the_remote_tokenizer(server, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    write_task(tasks)
    output = tmp_path / "results"
    model_args = ",".join([
        f"base_url={server.url}/v1/completions", f"model={serving.LLM}", "tokenizer_backend=remote",
        f"auth_token={serving.API_KEY}", "num_concurrent=1", "max_retries=1", f"max_length={serving.MAX_MODEL_LEN}",
    ])
    env = dict(os.environ, OPENAI_API_KEY=serving.API_KEY, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"))
    command = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
               "--tasks", "tessera_tiny", "--include_path", str(tasks), "--limit", str(len(DOCS)),
               "--output_path", str(output)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in output.rglob("results*.json")]
    assert results, f"no results file under {output}"
    accuracy = results[0]["results"]["tessera_tiny"]["acc,none"]
    assert 0.0 <= accuracy <= 1.0
    # SmolLM2 knows these; a broken log-likelihood path (wrong offsets, BOS, echo) would score near chance.
    assert accuracy >= 0.5, results[0]["results"]
