#!/usr/bin/env python3
"""Writes the request fuzzers' seeds: tests/fuzz/seeds/openai/* (one byte picking the endpoint, then
a JSON body) and tests/fuzz/openai.dict (the bodies' keys and tricky values) for fuzz_openai_request,
and tests/fuzz/seeds/grpc/* (serialized tessera.v1.GenerateRequest, encoded by protoc from text) for
fuzz_grpc_request."""
import json
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
# endpoint byte: 0 completions, 1 chat, 2 embeddings, 3 tokenize, 4 detokenize (fuzz_openai_request.cpp)
SEEDS = {
    "completion_text": (0, {"model": "m", "prompt": "Hello", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9,
                            "stop": ["\n"], "logprobs": 2, "echo": True, "n": 2, "seed": 7}),
    "completion_tokens": (0, {"model": "m", "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 0, "echo": True, "logprobs": 1}),
    "completion_attention": (0, {"model": "m", "prompt": "x", "tessera": {"attention": {"segments": {
        "lengths": [2, 3], "shared_prefix": 1, "positions": "parallel"}}}}),
    "completion_window": (0, {"model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": True},
                              "tessera": {"attention": {"sliding_window": {"window": 8, "sinks": 2}}},
                              "ignore_eos": True, "min_tokens": 2, "stop_token_ids": [2]}),
    "chat": (1, {"model": "m", "messages": [{"role": "system", "content": "s"},
                                            {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 "logprobs": True, "top_logprobs": 3, "max_completion_tokens": 5, "presence_penalty": 0.5,
                 "frequency_penalty": -0.5, "repetition_penalty": 1.1, "top_k": 5, "min_p": 0.1}),
    "completion_structured": (0, {"model": "m", "prompt": "x", "structured_outputs": {"regex": "[0-9]+"},
                                  "response_format": {"type": "text"}}),
    "chat_json_schema": (1, {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}}),
    "chat_tools": (1, {"model": "m", "tools": [{"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": False,
        "messages": [{"role": "user", "content": "x"},
                     {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "f", "arguments": "{\"x\": \"y\"}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "z"}]}),
    "embeddings": (2, {"model": "e", "input": ["a", "b"], "encoding_format": "base64", "truncate": False}),
    "embeddings_tokens": (2, {"model": "e", "input": [[101, 102]]}),
    "tokenize": (3, {"model": "m", "messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True}),
    "detokenize": (4, {"model": "m", "tokens": [1, 2, 3]}),
}
KEYS = ["model", "prompt", "messages", "role", "content", "max_tokens", "max_completion_tokens", "temperature", "top_p",
        "top_k", "min_p", "stop", "stream", "stream_options", "include_usage", "logprobs", "top_logprobs", "echo", "n",
        "best_of", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos", "min_tokens",
        "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "tessera", "attention", "causal",
        "bidirectional", "sliding_window", "window", "sinks", "segments", "lengths", "shared_prefix", "positions",
        "parallel", "sequential", "input", "encoding_format", "base64", "float", "truncate", "tokens",
        "add_special_tokens", "add_generation_prompt", "user", "system", "assistant", "tools", "response_format",
        "logit_bias", "suffix", "type", "text", "json_schema", "json_object", "schema", "strict", "name",
        "structured_outputs", "json", "regex", "choice", "grammar", "disable_any_whitespace", "tool_choice",
        "parallel_tool_calls", "function", "parameters", "description", "tool_calls", "tool_call_id", "arguments",
        "tool", "required", "none", "auto"]
VALUES = ["null", "true", "false", "-1", "0", "1e309", "[]", "{}", "\\u0000", "\\ud800"]


GRPC_SEEDS = {
    "text": 'model: "m" text: "Hello" max_tokens: 4 sampling { temperature: 0.5 top_p: 0.9 seed: 3 logprobs: 2 }',
    "tokens_window": 'model: "m" token_ids { ids: [1, 2, 3, 4] } '
                     'attention { sliding_window { window: 2 sinks: 1 } } sampling { min_tokens: 1 ignore_eos: true }',
    "chat_segments": 'model: "m" chat { messages { role: "user" content: "hi" } } '
                     'attention { segments { lengths: [3, 4] shared_prefix: 2 parallel_positions: true } } '
                     'stop: "x" sampling { stop_token_ids: [2] prompt_logprobs: 1 }',
    "structured": 'model: "m" text: "x" structured_output { json_schema: "{\\"type\\": \\"object\\"}" }',
    "chat_tools": 'model: "m" chat { messages { role: "user" content: "hi" } messages { role: "assistant" '
                  'tool_calls { id: "call_1" name: "f" arguments: "{}" } } messages { role: "tool" content: "r" '
                  'tool_call_id: "call_1" } } tools { name: "f" parameters: "{}" } tool_choice { function: "f" } '
                  'parallel_tool_calls: false',
}


def dict_entry(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main() -> None:
    seeds = HERE / "seeds" / "openai"
    seeds.mkdir(parents=True, exist_ok=True)
    for name, (endpoint, body) in SEEDS.items():
        (seeds / name).write_bytes(bytes([endpoint]) + json.dumps(body).encode())
    lines = ["# tests/fuzz/openai.dict: written by make_request_seeds.py, for fuzz_openai_request (-dict=)."]
    lines += [dict_entry(f'"{k}"') for k in KEYS] + [dict_entry(v) for v in VALUES]
    (HERE / "openai.dict").write_text("\n".join(lines) + "\n")
    grpc = HERE / "seeds" / "grpc"
    grpc.mkdir(parents=True, exist_ok=True)
    proto_root = HERE.parent.parent / "proto"
    for name, text in GRPC_SEEDS.items():
        encoded = subprocess.run(["protoc", f"--proto_path={proto_root}", "--encode=tessera.v1.GenerateRequest",
                                  "tessera/v1/inference.proto"], input=text.encode(), capture_output=True, check=True)
        (grpc / name).write_bytes(encoded.stdout)


if __name__ == "__main__":
    main()
