"""The Gemini API follows the same validation policy as the other protocols (issue 11, "one
validation policy"): a turn needs parts, a part has exactly one data field, unknown part
fields are a 400 (as Google answers them), a lone surrogate is the same "invalid Unicode"
400 naming the field. Against the real server on loopback; each test is the regression
test of one fault seen on main (a 200 with a generation from an empty turn)."""

from __future__ import annotations

import json

import httpx
import pytest

GENERATE = "/v1beta/models/local:generateContent"
STREAM = "/v1beta/models/local:streamGenerateContent?alt=sse"


def post(server, path: str, body: dict | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)  # ensure_ascii: \ud800 stays
    return httpx.post(server.root + path, content=content, timeout=120,
                      headers={"Content-Type": "application/json"})


def google_error(r: httpx.Response) -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    err = r.json()["error"]
    assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT"
    return err


def user(parts) -> dict:
    return {"contents": [{"role": "user", "parts": parts}],
            "generationConfig": {"maxOutputTokens": 3}}


def test_gemini_turn_without_parts_is_400_naming_contents_parts(server):
    err = google_error(post(server, GENERATE, user([])))
    assert err["message"].startswith("contents.0.parts")


@pytest.mark.parametrize("path", [GENERATE, STREAM])
@pytest.mark.parametrize("part", [{}, {"text": None}, {"thought": True}],
                         ids=["empty", "null-text", "metadata-only"])
def test_gemini_part_without_data_is_400_naming_the_part(server, path, part):
    err = google_error(post(server, path, user([part])))
    assert err["message"].startswith("contents.0.parts.0: ")
    assert "exactly one of text, functionCall" in err["message"]


@pytest.mark.parametrize("path", [GENERATE, STREAM])
def test_gemini_unknown_part_field_is_400_naming_it(server, path):
    err = google_error(post(server, path, user([{"bogus": 1}])))
    assert err["message"].startswith("contents.0.parts.0.bogus")


def test_gemini_part_with_two_data_fields_is_400(server):
    err = google_error(post(server, GENERATE, user([
        {"text": "hi", "functionCall": {"name": "f", "args": {}}}])))
    assert "got text, functionCall" in err["message"]


def test_gemini_lone_surrogate_is_the_invalid_unicode_400(server):
    err = google_error(post(server, GENERATE, user([{"text": "hi \ud800"}])))
    assert err["message"].startswith("contents.0.parts.0.text: ")
    assert "invalid Unicode: a lone surrogate" in err["message"]
    assert "unable to parse raw data" not in err["message"]


def test_gemini_text_with_thought_metadata_is_still_accepted(server):
    r = post(server, GENERATE, {"contents": [
        {"role": "user", "parts": [{"text": "hi"}]},
        {"role": "model", "parts": [{"text": "thinking", "thought": True,
                                     "thoughtSignature": "c2ln"}, {"text": "hello"}]},
        {"role": "user", "parts": [{"text": "again"}]}],
        "generationConfig": {"maxOutputTokens": 3}})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["candidates"][0]["content"]["role"] == "model"


def test_lone_surrogate_in_a_bounded_id_is_the_invalid_unicode_400(server):
    """The same rule in chat completions: a tool-call id (a length-bounded string) with a
    lone surrogate got pydantic's "unable to parse raw data" on main."""
    r = httpx.post(server.v1 + "/chat/completions", timeout=120, headers={
        "Content-Type": "application/json"}, content=json.dumps({
            "model": "local", "max_tokens": 3, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c\ud800", "type": "function",
                                                      "function": {"name": "f",
                                                                   "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "ok"}]}))
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "messages.1.tool_calls.0.id"
    assert "invalid Unicode: a lone surrogate" in err["message"]


# --- maxOutputTokens is a JSON integer (issue 25): shapes only, so in-process on the
# stand-in engine (validation refuses them before any engine would see them)

@pytest.mark.parametrize("path", [GENERATE, STREAM, "/v1beta/models/local:countTokens"])
@pytest.mark.parametrize("name", ["maxOutputTokens", "max_output_tokens"])
@pytest.mark.parametrize("value", [True, "5", 5.0], ids=["true", "string", "float"])
def test_gemini_max_output_tokens_that_is_not_an_integer_is_400_naming_it(
        stand_in, path, name, value):
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {name: value}}
    if path.endswith(":countTokens"):  # countTokens takes the config inside its request
        body = {"generateContentRequest": {"model": "models/local", **body}}
    err = google_error(stand_in.post(path, json=body))
    assert f"generationConfig.{name}: " in err["message"]


@pytest.mark.parametrize("value", [True, "2048", 5.0], ids=["true", "string", "float"])
def test_gemini_thinking_budget_that_is_not_an_integer_is_400_naming_it(stand_in, value):
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {"thinkingConfig": {"thinkingBudget": value}}}
    err = google_error(stand_in.post(GENERATE, json=body))
    assert "generationConfig.thinkingConfig.thinkingBudget: " in err["message"]


def test_gemini_integer_max_output_tokens_is_still_served(stand_in):
    r = stand_in.post(GENERATE, json=user([{"text": "hi"}]))
    assert r.status_code == 200, r.text[:500]


@pytest.mark.parametrize("seed", [2**31, -2**31 - 1, 2**64])
def test_a_gemini_seed_outside_int32_is_400_naming_it_not_a_500(stand_in, seed):
    """It reached ``mx.random.seed``, which took neither a negative nor a 65-bit seed: a
    500 with a pybind11 message and a traceback in the log."""
    body = {**user([{"text": "hi"}]), "generationConfig": {"seed": seed}}
    err = google_error(stand_in.post(GENERATE, json=body))
    assert "generationConfig.seed: " in err["message"]


def test_a_negative_gemini_seed_within_int32_is_served(stand_in):
    body = {**user([{"text": "hi"}]), "generationConfig": {"seed": -1, "maxOutputTokens": 4}}
    r = stand_in.post(GENERATE, json=body)
    assert r.status_code == 200, r.text[:500]
