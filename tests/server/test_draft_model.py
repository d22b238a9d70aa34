"""Speculative decoding (issue 29, ``serve --draft-model``): the starter's 4-bit variant
drafting for the float32 starter (the same tokenizer), one server.

What a user checks: greedy text with the draft is the text without it, token for token
(the session's greedy tools server, the same model without a draft, answers the same
prompts), streamed or not, on a
second turn from the prompt cache, and for a request that a second arrival moves into a
batch mid-answer; ``/health`` and ``/metrics`` count the drafted and accepted tokens; a
forced tool call (a grammar) decodes without the draft and still answers. A draft whose
tokenizer differs is refused at start naming both models
(tests/engine/test_draft_pairing.py covers the rules without a model)."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from tests.helpers import start_server, stop

pytestmark = pytest.mark.model

POEM = "Write a short poem about the sea."
STORY = "Tell me a story about a lighthouse keeper."


DRAFT = "mlx-kit/SmolLM2-135M-Instruct-4bit"


@pytest.fixture(scope="module")
def draft_server(hf_home, tools_server, tmp_path_factory):
    """The session's tools model (the f32 starter behind a ChatML template with tool
    calls; ``tools_server`` serves it without a draft) with the 4-bit starter drafting."""
    s = start_server(tmp_path_factory.mktemp("home-draft"), hf_home, "--temperature", "0",
                     "--model", str(tools_server.model), "--draft-model", DRAFT)
    yield s
    stop(s)


def ask(server, text: str, max_tokens: int = 24, history=(), **extra) -> dict:
    r = httpx.post(server.v1 + "/chat/completions", timeout=180, json={
        "model": "local", "max_tokens": max_tokens, "temperature": 0,
        "messages": [*history, {"role": "user", "content": text}], **extra})
    assert r.status_code == 200, r.text
    return r.json()


def text_of(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def streamed(server, text: str, max_tokens: int = 24) -> str:
    out = ""
    with httpx.stream("POST", server.v1 + "/chat/completions", timeout=180, json={
            "model": "local", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": text}]}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    out += choice["delta"].get("content") or ""
    return out


def test_greedy_text_with_the_draft_is_the_text_without_it(draft_server, tools_server):
    plain = text_of(ask(tools_server, POEM))
    assert text_of(ask(draft_server, POEM)) == plain
    assert streamed(draft_server, POEM) == plain
    draft = draft_server.health()["draft"]
    assert draft["model"] == DRAFT
    assert draft["pairings"] == {str(tools_server.model): DRAFT}
    assert draft["drafted"] > 0 and 0 < draft["accepted"] <= draft["drafted"]
    assert draft["acceptance"] == round(draft["accepted"] / draft["drafted"], 4)
    # a 4-bit draft on mlx's CPU backend prefills ~20x slower than float32: said at start
    assert "is quantized and mlx runs on the CPU here" in draft_server.log_text()
    metrics = httpx.get(draft_server.root + "/metrics").text
    assert f"mlx_kit_draft_accepted_tokens_total {float(draft['accepted'])}" in metrics


def test_a_second_turn_reuses_both_models_cache_and_answers_as_without_the_draft(
        draft_server, tools_server):
    first = ask(draft_server, STORY)
    history = [{"role": "user", "content": STORY},
               {"role": "assistant", "content": text_of(first)}]
    second = ask(draft_server, "And then?", history=history)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > \
        first["usage"]["prompt_tokens"]
    assert text_of(second) == text_of(ask(tools_server, "And then?", history=history))


def test_a_request_moved_into_a_batch_mid_answer_keeps_its_text(draft_server, tools_server):
    # the first decodes alone with the draft; the second arrives while it runs, so the
    # first moves into a batch (without the draft) and both finish there
    long_one, other = "Describe a walk in a forest in detail.", "Name three colours."
    want = {long_one: text_of(ask(tools_server, long_one, 40)),
            other: text_of(ask(tools_server, other, 8))}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, draft_server, long_one, 40)
        time.sleep(0.3)
        second = pool.submit(ask, draft_server, other, 8)
        got = {long_one: text_of(first.result()), other: text_of(second.result())}
    assert got == want
    assert "joins a batch" in draft_server.log_text()  # it did move, mid-answer


def test_a_forced_tool_call_decodes_without_the_draft(draft_server):
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    before = draft_server.health()["draft"]["drafted"]
    body = ask(draft_server, "Weather in Paris?", 30, tools=[tool], tool_choice="required")
    calls = body["choices"][0]["message"].get("tool_calls") or []
    assert calls and calls[0]["function"]["name"] == "get_weather"
    assert "city" in json.loads(calls[0]["function"]["arguments"])
    assert draft_server.health()["draft"]["drafted"] == before
