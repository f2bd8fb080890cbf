"""Structured outputs and tool calling against a real `tessera serve` (SmolLM2, ChatML, so Hermes
<tool_call> calls): response_format json_schema through the OpenAI SDK (validated with jsonschema)
and its Pydantic `parse`; vLLM's structured_outputs regex, choice and EBNF grammar; tools with each
tool_choice, streamed and not (a stream accumulates to the unstreamed answer); a multi-turn exchange
that sends tool results back; gRPC's structured_output and tools; /tokenizer_info; and bad input,
each a 400 naming its field, after which the server still serves."""

from __future__ import annotations

import json
import re

import jsonschema
import pydantic
import pytest
import requests

import serving

MAX_TOKENS = 48
SEED = 7

PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time in a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                                "required": ["city"], "additionalProperties": False}},
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]


def chat(client, **kwargs):
    kwargs.setdefault("model", serving.LLM)
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("seed", SEED)
    return client.chat.completions.create(**kwargs)


def post(server, path, body):
    return requests.post(server.url + path, json=body, headers=server.auth_headers(), timeout=120)


def assert_400(response, param):
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["param"] is not None and error["param"].startswith(param), error
    assert error["type"] == "invalid_request_error"
    return error["message"]


# -- response_format and structured_outputs ---------------------------------------------------------


def test_json_schema_output_validates(client):
    r = chat(client, messages=[{"role": "user", "content": "Invent a person. Reply in JSON."}],
             response_format={"type": "json_schema",
                              "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}},
             max_tokens=64)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON_SCHEMA)


def test_json_schema_with_n_choices_logprobs_and_a_stop_string(client):
    # Each choice is its own sequence with its own grammar state; logprobs are those of the
    # constrained distribution; a stop string still cuts the output.
    r = chat(client, messages=[{"role": "user", "content": "Describe a person as JSON."}], n=3, temperature=0.8,
             logprobs=True, top_logprobs=2, max_tokens=64,
             response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}})
    assert len(r.choices) == 3
    assert any(c.finish_reason == "stop" for c in r.choices)
    for c in r.choices:
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.message.content), PERSON_SCHEMA)
        assert c.logprobs.content and all(t.logprob <= 0 for t in c.logprobs.content)
    cut = chat(client, messages=[{"role": "user", "content": "Describe a person as JSON."}], stop=['"age"'],
               response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}})
    assert cut.choices[0].finish_reason == "stop"
    assert '"age"' not in cut.choices[0].message.content and cut.choices[0].message.content.startswith("{")


def test_json_object_output_parses(client):
    # The SDK's completions.create has no response_format argument; the server takes it there too.
    r = client.completions.create(model=serving.LLM, prompt="A JSON object describing a cat, with its name and age:", max_tokens=64,
                                  temperature=0, extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].text
    assert isinstance(json.loads(r.choices[0].text), dict)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    country: str = pydantic.Field(max_length=16)


def test_sdk_parse_with_a_pydantic_model(client):
    r = client.chat.completions.parse(model=serving.LLM, messages=[{"role": "user", "content": "Name a city."}],
                                      response_format=City, max_tokens=64, temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, City), r.choices[0].message.content


def test_structured_outputs_regex(client):
    pattern = r"[0-9]{3}-[a-z]{2}"
    r = client.completions.create(model=serving.LLM, prompt="A code:", max_tokens=16, temperature=0,
                                  extra_body={"structured_outputs": {"regex": pattern}})
    assert re.fullmatch(pattern, r.choices[0].text), r.choices[0].text


def test_structured_outputs_choice(client):
    choices = ["positive", "negative", "neutral"]
    r = chat(client, messages=[{"role": "user", "content": "Sentiment of 'I love this!'?"}],
             extra_body={"structured_outputs": {"choice": choices}})
    assert r.choices[0].message.content in choices


ARITHMETIC = r'''
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9] | [1-9] [0-9]
'''


def parses_as_arithmetic(text: str) -> bool:
    """A recursive-descent check of ARITHMETIC (no whitespace, numbers of one or two digits)."""
    pos = 0

    def number():
        nonlocal pos
        m = re.match(r"[1-9][0-9]|[0-9]", text[pos:])
        if not m:
            raise ValueError(pos)
        pos += m.end()

    def factor():
        nonlocal pos
        if text[pos:pos + 1] == "(":
            pos += 1
            expr()
            if text[pos:pos + 1] != ")":
                raise ValueError(pos)
            pos += 1
        else:
            number()

    def term():
        nonlocal pos
        factor()
        while text[pos:pos + 1] in ("*", "/") and pos < len(text):
            pos += 1
            factor()

    def expr():
        nonlocal pos
        term()
        while text[pos:pos + 1] in ("+", "-") and pos < len(text):
            pos += 1
            term()

    try:
        expr()
    except ValueError:
        return False
    return pos == len(text)


def test_structured_outputs_ebnf_grammar(client):
    r = chat(client, messages=[{"role": "user", "content": "Write an arithmetic expression."}],
             extra_body={"structured_outputs": {"grammar": ARITHMETIC}}, max_tokens=24)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    assert parses_as_arithmetic(text), text


# -- tools --------------------------------------------------------------------------------------------


def accumulate(stream):
    """The streamed chunks of one choice as (content, [(name, arguments)], finish_reason)."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
            if call.id:
                assert entry["id"] is None, "a call's id comes once, on its first delta"
                entry["id"] = call.id
                assert call.type == "function"
            if call.function and call.function.name:
                entry["name"] += call.function.name
            if call.function and call.function.arguments:
                entry["arguments"] += call.function.arguments
        finish = choice.finish_reason or finish
    assert all(c["id"] and c["id"].startswith("call_") and len(c["id"]) == 29 for c in calls.values()), calls
    return content, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], finish


def unstreamed(message):
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return message.content or "", calls


def check_weather_call(name, arguments):
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_tool_call(client, tool_choice):
    r = chat(client, messages=WEATHER_QUESTION, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=tool_choice,
             parallel_tool_calls=False, max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id)
    if tool_choice != "required":
        check_weather_call(call.function.name, call.function.arguments)
    else:
        assert call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)


@pytest.mark.parametrize("tool_choice", ["none", "auto", "required"])
def test_streamed_tool_answer_accumulates_to_the_unstreamed_one(client, tool_choice):
    kwargs = dict(messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=64)
    whole = chat(client, **kwargs).choices[0]
    content, calls, finish = accumulate(chat(client, stream=True, **kwargs))
    assert (content, calls) == unstreamed(whole.message)
    assert finish == whole.finish_reason
    if tool_choice == "none":
        assert calls == [] and finish != "tool_calls"
    if tool_choice == "required":
        assert finish == "tool_calls" and calls


def test_tool_results_sent_back(client):
    first = chat(client, messages=WEATHER_QUESTION, tools=[WEATHER_TOOL],
                 tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    messages = WEATHER_QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    second = chat(client, messages=messages, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=24)
    assert second.choices[0].message.content
    assert second.choices[0].message.tool_calls in (None, [])


# -- gRPC ---------------------------------------------------------------------------------------------


def test_grpc_structured_output_and_tools(server, stub, pb):
    inference = pb[0]
    metadata = server.grpc_metadata()
    request = inference.GenerateRequest(model=serving.LLM, text="A code:", max_tokens=16,
                                        sampling=inference.SamplingParams(temperature=0),
                                        structured_output=inference.StructuredOutput(regex="[0-9]{4}"))
    text = "".join(c.text for c in stub.Generate(request, metadata=metadata))
    assert re.fullmatch("[0-9]{4}", text), text

    chat_messages = inference.ChatMessages(messages=[inference.ChatMessage(role="user", content=WEATHER_QUESTION[0]["content"])])
    tool = inference.Tool(name="get_weather", description="The current weather in a city",
                          parameters=json.dumps(WEATHER_TOOL["function"]["parameters"]))
    request = inference.GenerateRequest(model=serving.LLM, chat=chat_messages, max_tokens=64, tools=[tool],
                                        tool_choice=inference.ToolChoice(function="get_weather"),
                                        sampling=inference.SamplingParams(temperature=0))
    chunks = list(stub.Generate(request, metadata=metadata))
    deltas = [d for c in chunks for d in c.tool_calls]
    assert deltas and deltas[0].name == "get_weather" and deltas[0].id.startswith("call_")
    check_weather_call(deltas[0].name, "".join(d.arguments for d in deltas))
    assert chunks[-1].finish_reason == inference.FINISH_REASON_TOOL_CALLS


def test_grpc_bad_schema_names_the_field(server, stub, pb):
    import grpc  # noqa: PLC0415

    inference = pb[0]
    request = inference.GenerateRequest(model=serving.LLM, text="x", max_tokens=4,
                                        structured_output=inference.StructuredOutput(json_schema="[1, 2]"))
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(request, metadata=server.grpc_metadata()))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "structured_output.json_schema" in caught.value.details()


# -- /tokenizer_info ----------------------------------------------------------------------------------


def test_tokenizer_info(server):
    r = requests.get(server.url + "/tokenizer_info", headers=server.auth_headers(), timeout=30)
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["tokenizer_class"]
    assert info["eos_token"] == "<|im_end|>"
    assert info["model_max_length"] == serving.MAX_MODEL_LEN
    assert "<|im_start|>" in info["chat_template"]
    ids = post(server, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 1
    assert post(server, "/detokenize", {"tokens": ids}).json()["prompt"] == info["eos_token"]


# -- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}},
     "response_format", ["json_schema"]),
    ({"structured_outputs": {"regex": "([0-9]"}}, "structured_outputs", ["regex"]),
    ({"structured_outputs": {"regex": "[0-9]", "choice": ["a"]}}, "structured_outputs", ["exactly one"]),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_stock_price"}}},
     "tool_choice", ["get_stock_price"]),
    ({"tools": [WEATHER_TOOL] * 2}, "tools", ["get_weather"]),
], ids=["invalid_schema", "bad_regex", "two_kinds", "unknown_tool", "duplicate_tool"])
def test_bad_input_is_a_400_naming_the_field(server, client, extra, param, words):
    body = {"model": serving.LLM, "messages": WEATHER_QUESTION, "max_tokens": 4, **extra}
    message = assert_400(post(server, "/v1/chat/completions", body), param)
    for word in words:
        assert word in message, message
    assert chat(client, messages=WEATHER_QUESTION, max_tokens=2).choices[0].finish_reason == "length"


@pytest.fixture(scope="module")
def llama2_server(tmp_path_factory, models_present):
    """SmolLM2 served with the Llama-2 template, which has no tool-call format."""
    model = {"name": serving.LLM, "path": str(serving.model_dir() / serving.LLM_DIR), "kind": "llm",
             "chat_template": "llama2"}
    srv = serving.TesseraServer(tmp_path_factory.mktemp("llama2"), embedding=False, settings={"models": [model]})
    srv.start()
    yield srv
    srv.stop()


def test_tools_on_a_template_without_a_tool_format(llama2_server):
    body = {"model": serving.LLM, "messages": WEATHER_QUESTION, "max_tokens": 4, "tools": [WEATHER_TOOL]}
    message = assert_400(post(llama2_server, "/v1/chat/completions", body), "tools")
    assert "tool-call format" in message
    del body["tools"]
    assert post(llama2_server, "/v1/chat/completions", body).status_code == 200
