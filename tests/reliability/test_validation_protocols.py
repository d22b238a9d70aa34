"""One validation policy for all protocols (issue 11, items 6 and 7), against the real
server on loopback: every malformed shape is a 400 naming the field (never a 500), the
same rules for roles, content types, numeric ranges and Unicode in chat completions,
Responses and Messages, token-id prompts on /v1/completions, swap targets that are not
models. Each test is the regression test of one fault seen on main."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

USER = [{"role": "user", "content": "hi"}]
CHAT, RESPONSES, MESSAGES = "/chat/completions", "/responses", "/messages"


def post(server, path: str, body: dict | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)  # ensure_ascii: \ud800 stays
    return httpx.post(server.v1 + path, content=content, timeout=120,
                      headers={"Content-Type": "application/json"})


def openai_error(r: httpx.Response) -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    return r.json()["error"]


def anthropic_error(r: httpx.Response) -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]


# --- item 6: client mistakes answered with 500 ---------------------------------------------

def test_chat_tool_call_function_as_a_string_is_400_naming_it(server):
    r = post(server, CHAT, {"model": "local", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": "x"}]}]})
    err = openai_error(r)
    assert err["param"] == "messages.1.tool_calls.0.function"
    assert err["message"].startswith("messages.1.tool_calls.0.function: ")


def test_responses_string_content_part_is_400_naming_it(server):
    r = post(server, RESPONSES, {"model": "local", "input": [
        {"type": "message", "role": "user", "content": ["hi"]}]})
    err = openai_error(r)
    assert err["param"] == "input.0.content.0"
    assert "input_text" in err["message"]  # says what is accepted


def test_messages_string_in_tool_result_content_is_400_naming_it(server):
    r = post(server, MESSAGES, {"model": "local", "max_tokens": 5, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": ["oops"]}]}]})
    assert "messages.2.content.0.content.0" in anthropic_error(r)["message"]


def test_deeply_nested_tool_schema_is_400_and_the_server_lives(server):
    # 100 levels: under the body's limit (128, the edge), over a field's (64); it used to
    # overflow while the request was pickled for the engine
    deep = "[" * 100 + "]" * 100
    body = ('{"model": "local", "messages": [{"role": "user", "content": "hi"}], "tools": '
            '[{"type": "function", "function": {"name": "f", "parameters": {"x": %s}}}]}'
            % deep)
    r = post(server, CHAT, body)
    err = openai_error(r)
    assert err["param"] == "tools.0.function.parameters" and "deeper than" in err["message"]
    assert len(r.text) < 2000  # the error does not echo the nesting
    for levels in (900, 5000):  # beyond the edge's limit; 5000 is beyond what json reads
        deeper = "[" * levels + "]" * levels
        r = post(server, CHAT, '{"model": "local", "x": %s}' % deeper)
        assert r.status_code == 400 and openai_error(r)["code"] == "json_too_deep"
    assert server.health()["status"] == "ok"


@pytest.mark.parametrize("target", ["/etc", "../..", "/"])
def test_swap_to_a_folder_that_is_not_a_model_is_400_and_nothing_changes(server, target):
    before = server.health()["model"]
    r = server.swap(target)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "model" and err["code"] == "invalid_model"
    assert "is not a model folder (no config.json)" in err["message"]
    assert server.health()["model"] == before


def test_swap_to_a_megabyte_name_is_400_with_a_short_message(server):
    r = server.swap("x" * 1_000_000)
    assert r.status_code == 400, r.text[:300]
    assert len(r.content) < 1000 and "too long" in r.json()["error"]["message"]
    r = server.swap("bad\x00name")
    assert r.status_code == 400 and "control characters" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
def test_a_megabyte_model_name_is_400_without_the_megabyte_in_the_answer(server, path):
    body = {"model": "x" * 1_000_000, "max_tokens": 5, "messages": USER, "input": "hi"}
    r = post(server, path, body)
    assert r.status_code == 400, r.text[:300]
    assert len(r.content) < 1000
    assert "at most 256 characters" in r.text


# --- item 7: protocols agree on what is valid -----------------------------------------------

@pytest.mark.parametrize("path,body", [
    (CHAT, {"messages": [{"role": "bogus", "content": "hi"}]}),
    (RESPONSES, {"input": [{"type": "message", "role": "bogus", "content": "hi"}]}),
    (RESPONSES, {"input": [{"role": "bogus", "content": "hi"}]}),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "bogus", "content": "hi"}]}),
])
def test_an_unknown_role_is_400_in_every_protocol(server, path, body):
    r = post(server, path, {"model": "local", **body})
    assert r.status_code == 400, r.text[:300]
    assert "role" in r.text and "should be" in r.text


@pytest.mark.parametrize("path,body,where", [
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
     "messages.0.content.0"),
    (RESPONSES, {"input": [{"role": "user", "content": [{"type": "bogus"}]}]},
     "input.0.content.0"),
    (RESPONSES, {"input": [{"type": "bogus"}]}, "input.0"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "bogus", "text": "hi"}]}]}, "messages.0.content.0"),
])
def test_an_unknown_content_type_is_400_in_every_protocol(server, path, body, where):
    r = post(server, path, {"model": "local", **body})
    assert r.status_code == 400, r.text[:300]
    assert where in r.text and "unknown or missing" in r.text


@pytest.mark.parametrize("path,body,where", [
    (CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
     "messages.0.content.0"),
    (RESPONSES, {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]},
     "input.0.content.0"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AA=="}}]}]}, "messages.0.content.0"),
])
def test_images_are_refused_with_a_clear_400_in_every_protocol(server, path, body, where):
    r = post(server, path, {"model": "local", **body})
    assert r.status_code == 400, r.text[:300]
    assert "image content is not supported by this text-only model" in r.text
    if path != MESSAGES:
        assert r.json()["error"]["param"] == where


def test_messages_history_blocks_anthropic_documents_are_accepted(server):
    """Thinking and server-tool blocks in history are documented: accepted, not re-sent."""
    r = post(server, MESSAGES, {"model": "local", "max_tokens": 3, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
            {"type": "text", "text": "hello"}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}]}]})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["stop_reason"] in ("end_turn", "max_tokens")


@pytest.mark.parametrize("path,body,where", [
    (CHAT, {"messages": [{"role": "user", "content": "caf\ud800"}]}, "messages.0.content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
     "messages.0.content.0.text"),
    (CHAT, {"messages": USER, "stop": ["\ud800"]}, "stop.0"),
    (RESPONSES, {"input": "\ud800"}, "input"),
    (RESPONSES, {"input": "hi", "instructions": "\ud800"}, "instructions"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": "\ud800"}]},
     "messages.0.content"),
    (MESSAGES, {"max_tokens": 5, "system": "\ud800", "messages": USER}, "system"),
])
def test_a_lone_surrogate_is_400_naming_the_field_in_every_protocol(server, path, body, where):
    r = post(server, path, {"model": "local", **body})
    assert r.status_code == 400, r.text[:300]
    assert f"{where}: invalid Unicode: a lone surrogate" in r.text
    assert "tokeniz" not in r.text.lower()


def test_a_lone_surrogate_in_a_tool_schema_is_400(server):
    r = post(server, CHAT, {"model": "local", "messages": USER, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"\ud800": {"type": "string"}}}}}]})
    err = openai_error(r)
    assert err["param"] == "tools.0.function.parameters" and "lone surrogate" in err["message"]


@pytest.mark.parametrize("path,body,param", [
    (CHAT, {"messages": USER, "logit_bias": {"1": 1e308}}, "logit_bias.1"),
    (CHAT, {"messages": USER, "logit_bias": {"1": -101}}, "logit_bias.1"),
    (CHAT, {"messages": USER, "logit_bias": {"x": 1}}, "logit_bias.x"),
    (CHAT, {"messages": USER, "temperature": 2.5}, "temperature"),
    (CHAT, {"messages": USER, "top_p": 0}, "top_p"),
    (CHAT, {"messages": USER, "max_tokens": 0}, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": 2**40}, "max_tokens"),
    (CHAT, {"messages": USER, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"messages": USER, "n": 0}, "n"),
    (CHAT, {"messages": USER, "presence_penalty": 3}, "presence_penalty"),
    ("/completions", {"prompt": "hi", "logprobs": 6}, "logprobs"),
    ("/completions", {"prompt": "hi", "temperature": -1}, "temperature"),
    (RESPONSES, {"input": "hi", "temperature": 2.5}, "temperature"),
    (RESPONSES, {"input": "hi", "top_p": 1.5}, "top_p"),
    (RESPONSES, {"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
])
def test_numbers_outside_openais_documented_ranges_are_400(server, path, body, param):
    err = openai_error(post(server, path, {"model": "local", **body}))
    assert err["param"] == param


def test_non_finite_numbers_are_400(server):
    # Python's json (and so the server) reads NaN and Infinity; they are not numbers here
    body = '{"model": "local", "messages": [{"role": "user", "content": "hi"}], ' \
           '"temperature": NaN}'
    assert openai_error(post(server, CHAT, body))["param"] == "temperature"
    body = body.replace('"temperature": NaN', '"logit_bias": {"5": Infinity}')
    assert openai_error(post(server, CHAT, body))["param"] == "logit_bias.5"


@pytest.mark.parametrize("body,field", [
    ({"temperature": 1.5}, "temperature"),  # Anthropic's range is 0-1
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_k": -1}, "top_k"),
])
def test_numbers_outside_anthropics_documented_ranges_are_400(server, body, field):
    r = post(server, MESSAGES, {"model": "local", "max_tokens": 5, "messages": USER, **body})
    assert anthropic_error(r)["message"].startswith(f"{field}: ")


# --- token counts are JSON integers (issue 25) ------------------------------------------------
# Shapes only, so in-process on the stand-in engine: validation refuses them before any
# engine would see them; a well-formed count gets the stand-in's answer.

NOT_INTEGERS = pytest.mark.parametrize("value", [True, False, "5", 5.0],
                                       ids=["true", "false", "string", "float"])
OPENAI_COUNTS = [(CHAT, {"messages": USER}, "max_tokens"),
                 (CHAT, {"messages": USER}, "max_completion_tokens"),
                 ("/completions", {"prompt": "hi"}, "max_tokens"),
                 (RESPONSES, {"input": "hi"}, "max_output_tokens")]


@NOT_INTEGERS
@pytest.mark.parametrize("path,body,field", OPENAI_COUNTS)
def test_a_token_count_that_is_not_an_integer_is_400_naming_it_on_openai_routes(
        stand_in, path, body, field, value):
    r = stand_in.post("/v1" + path, json={"model": "local", **body, field: value})
    err = openai_error(r)
    assert err["param"] == field and err["message"].startswith(f"{field}: ")


@NOT_INTEGERS
def test_anthropic_max_tokens_that_is_not_an_integer_is_400_naming_it(stand_in, value):
    r = stand_in.post("/v1" + MESSAGES, json={"model": "local", "messages": USER,
                                               "max_tokens": value})
    assert anthropic_error(r)["message"].startswith("max_tokens: ")


@NOT_INTEGERS
def test_anthropic_thinking_budget_that_is_not_an_integer_is_400_naming_it(stand_in, value):
    r = stand_in.post("/v1" + MESSAGES, json={
        "model": "local", "messages": USER, "max_tokens": 5,
        "thinking": {"type": "enabled", "budget_tokens": value}})
    assert anthropic_error(r)["message"].startswith("thinking.budget_tokens: ")


@pytest.mark.parametrize("path,body,field", [*OPENAI_COUNTS, (MESSAGES, {"messages": USER},
                                                               "max_tokens")])
def test_an_integer_token_count_is_still_served(stand_in, path, body, field):
    r = stand_in.post("/v1" + path, json={"model": "local", **body, field: 5})
    assert r.status_code == 200, r.text[:500]


# --- token-id prompts on /v1/completions -----------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(hf_home: Path):
    from tokenizers import Tokenizer

    found = sorted(hf_home.glob("hub/models--mlx-kit--SmolLM2-135M-Instruct/snapshots/*/"
                                "tokenizer.json"))
    assert found, "the starter's tokenizer.json is in the session's hub cache"
    return Tokenizer.from_file(str(found[0]))


def test_a_token_id_prompt_runs_like_its_text(server, tokenizer):
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
    text = "The capital of France is"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    by_text = client.completions.create(model="local", prompt=text, max_tokens=8)
    by_ids = client.completions.create(model="local", prompt=ids, max_tokens=8)
    nested = client.completions.create(model="local", prompt=[ids], max_tokens=8)
    assert by_ids.usage.prompt_tokens == nested.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == nested.choices[0].text == by_text.choices[0].text
    assert by_ids.choices[0].text.strip()


@pytest.mark.parametrize("prompt,message", [
    ([10**8], "token id 100000000 is not in this model's vocabulary"),
    ([1, -1], "greater than or equal to 0"),
    ([[]], "the token list is empty"),
    ([[1], [2]], "only one prompt per request"),
    ("", "prompt is empty"),  # found by the fuzz test: a 500 from deep in mlx-lm
    ([""], "prompt is empty"),
])
def test_bad_token_id_prompts_are_400_naming_the_prompt(server, prompt, message):
    err = openai_error(post(server, "/completions", {"model": "local", "prompt": prompt,
                                                     "max_tokens": 2}))
    assert err["param"].startswith("prompt") and message in err["message"]


def test_the_server_is_alive_after_all_that(server):
    assert server.health()["status"] == "ok"
    r = post(server, CHAT, {"model": "local", "messages": USER, "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
