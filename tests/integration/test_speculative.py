"""Speculative decoding through the server: with speculative.method set, a greedy completion is the
same text (with the same logprobs, up to rounding) as the same request to a server that does not
speculate, drafts are counted in vLLM's spec_decode_* series, and sampled requests still work."""

from __future__ import annotations

import pytest
import requests

import serving

# A prompt that the answer tends to copy: where prompt lookup has something to find.
PROMPT = ("Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape, honeydew.\n"
          "Copy: apple, banana,")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    srv = serving.TesseraServer(tmp_path_factory.mktemp("spec-none"), embedding=False).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module", params=["ngram", "suffix"])
def server(request, tmp_path_factory):
    srv = serving.TesseraServer(tmp_path_factory.mktemp(f"spec-{request.param}"), embedding=False,
                                settings={"speculative": {"method": request.param, "num_speculative_tokens": 4,
                                                          "prompt_lookup_min": 1,
                                                          # every draft verified, on the CPU too
                                                          "untimed_row_cost": 0}}).start()
    yield srv
    srv.stop()


def complete(srv: serving.TesseraServer, **extra) -> dict:
    body = {"model": serving.LLM, "prompt": PROMPT, "max_tokens": 40, "temperature": 0, **extra}
    response = requests.post(srv.url + "/v1/completions", json=body, headers=srv.auth_headers(), timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_greedy_text_and_logprobs_are_the_same_with_and_without_speculation(server, plain):
    speculated = complete(server, logprobs=1)
    reference = complete(plain, logprobs=1)
    assert speculated["choices"][0]["text"] == reference["choices"][0]["text"]
    assert speculated["usage"]["completion_tokens"] == reference["usage"]["completion_tokens"]
    got = speculated["choices"][0]["logprobs"]["token_logprobs"]
    want = reference["choices"][0]["logprobs"]["token_logprobs"]
    assert got == pytest.approx(want, abs=1e-3)
    drafts = server.metric("tessera:spec_decode_num_draft_tokens_total", model_name=serving.LLM)
    accepted = server.metric("tessera:spec_decode_num_accepted_tokens_total", model_name=serving.LLM)
    assert drafts > 0 and 0 < accepted <= drafts
    assert plain.metric("tessera:spec_decode_num_draft_tokens_total", model_name=serving.LLM) == 0


def test_sampled_requests_still_complete(server):
    answer = complete(server, temperature=0.8, seed=3)
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")
    assert answer["usage"]["completion_tokens"] >= 1
