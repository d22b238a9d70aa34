"""Reasoning options and returned reasoning, every protocol, model-free: what reaches the
chat template (``ChatRequest.template_kwargs`` and the history's assistant turns) from
OpenAI chat ``reasoning_effort``, Responses ``reasoning.effort``, Anthropic ``thinking`` /
``output_config.effort`` and Gemini ``thinkingConfig``; gpt-oss's template reads
``reasoning_effort`` (``Reasoning: <effort>``) and an assistant turn's ``thinking``, most
other thinking templates ``enable_thinking`` and ``reasoning_content``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kit.errors import InvalidRequest
from kit.server import anthropic, openai_chat, openai_responses
from kit.server.content import field_path
from kit.server.errors import api_error
from kit.server.gemini_schemas import GenerateContentRequest
from kit.server.gemini_translate import GEMINI_FIELDS
from kit.server.gemini_translate import to_engine_request as gemini_request
from kit.server.openai_common import OPENAI_FIELDS
from kit.server.translate import EFFORTS, budget_effort
from tests.server.test_translation import DEFAULTS, QUESTION, READ

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "read", "arguments": '{"path": "a"}'}}


def chat(**body):
    return openai_chat.to_engine_request(openai_chat.ChatCompletionRequest.model_validate(
        {"model": "local", "messages": QUESTION, **body}), DEFAULTS)


def responses(**body):
    return openai_responses.to_engine_request(openai_responses.ResponsesRequest.model_validate(
        {"model": "local", "input": "q", **body}), DEFAULTS)


def messages(**body):
    return anthropic.to_engine_request(anthropic.MessagesRequest.model_validate(
        {"model": "local", "max_tokens": 64, "messages": QUESTION, **body}), DEFAULTS)


def gemini(config):
    return gemini_request(GenerateContentRequest.model_validate(
        {"contents": [{"role": "user", "parts": [{"text": "q"}]}],
         "generationConfig": {"thinkingConfig": config}}), DEFAULTS)


@pytest.mark.parametrize("effort", EFFORTS)
def test_every_known_effort_reaches_the_template_as_given(effort):
    off = effort in ("none", "minimal")
    want = {"reasoning_effort": effort, "enable_thinking": not off}
    assert chat(reasoning_effort=effort).template_kwargs == want
    assert responses(reasoning={"effort": effort}).template_kwargs == want
    assert messages(output_config={"effort": effort}).template_kwargs == want


@pytest.mark.parametrize("make, field, fields", [
    (lambda: chat(reasoning_effort="ultra"), "reasoning_effort", OPENAI_FIELDS),
    (lambda: responses(reasoning={"effort": "HIGH"}), "reasoning.effort",
     openai_responses.RESPONSES_FIELDS),
    (lambda: messages(output_config={"effort": "turbo"}), "output_config.effort",
     anthropic.ANTHROPIC_FIELDS),
], ids=["chat", "responses", "messages"])
def test_an_unknown_effort_is_a_400_naming_the_field(make, field, fields):
    with pytest.raises(InvalidRequest) as e:
        make()
    err = api_error(e.value, dict(fields))
    assert (err.status, err.param, err.code) == (400, field, "invalid_value")
    assert "low, medium, high" in err.message


def test_chat_template_kwargs_still_win_over_reasoning_effort():
    req = chat(reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"})
    assert req.template_kwargs == {"reasoning_effort": "low", "enable_thinking": True}


@pytest.mark.parametrize("thinking, effort, want", [
    ({"type": "enabled", "budget_tokens": 4000}, None,  # Claude Code's "think"
     {"reasoning_effort": "low", "enable_thinking": True}),
    ({"type": "enabled", "budget_tokens": 10000}, None,  # "think hard"
     {"reasoning_effort": "medium", "enable_thinking": True}),
    ({"type": "enabled", "budget_tokens": 31999}, None,  # "ultrathink"
     {"reasoning_effort": "high", "enable_thinking": True}),
    ({"type": "enabled", "budget_tokens": 31999}, "low",  # an explicit effort wins
     {"reasoning_effort": "low", "enable_thinking": True}),
    ({"type": "disabled"}, None, {"enable_thinking": False}),
    ({"type": "adaptive"}, None, {}),  # the model decides: the template's default
    ({"type": "adaptive"}, "max", {"reasoning_effort": "max", "enable_thinking": True}),
    # a newer beta type is taken as adaptive (beta fields are accepted and ignored)
    ({"type": "sometimes"}, None, {}),
    (None, None, {}),
])
def test_anthropic_thinking_becomes_an_effort(thinking, effort, want):
    body = {"thinking": thinking} if thinking else {}
    if effort:
        body["output_config"] = {"effort": effort}
    assert messages(**body).template_kwargs == want


@pytest.mark.parametrize("thinking, field", [
    ({"type": "enabled", "budget_tokens": 100}, "thinking.budget_tokens"),  # < 1024
    ({"type": "enabled", "budget_tokens": 2**31}, "thinking.budget_tokens"),
    ({"type": 5}, "thinking.type"),
])
def test_anthropic_thinking_out_of_range_is_named(thinking, field):
    body = {"model": "m", "max_tokens": 1, "messages": QUESTION, "thinking": thinking}
    with pytest.raises(ValidationError) as e:
        anthropic.MessagesRequest.model_validate(body)
    assert field_path(e.value.errors()[0]["loc"], body) == field


def test_budgets_map_to_efforts_at_the_documented_steps():
    assert [budget_effort(b) for b in (None, -1, 0, 1024, 4096, 4097, 16384, 16385)] == [
        None, None, "none", "low", "low", "medium", "medium", "high"]


def test_gemini_thinking_levels_become_efforts():
    assert gemini({"thinkingLevel": "LOW"}).template_kwargs == {
        "reasoning_effort": "low", "enable_thinking": True}
    with pytest.raises(ValidationError):
        gemini({"thinkingLevel": "EXTREME"})
    assert GEMINI_FIELDS  # its errors are named in Gemini's words (test_gemini.py)


# --- the reasoning a client sends back ----------------------------------------------------

def test_chat_returned_reasoning_reaches_both_names_templates_read():
    for key in ("reasoning_content", "reasoning"):
        req = chat(messages=QUESTION + [
            {"role": "assistant", "content": None, "tool_calls": [CALL], key: "Read a."},
            {"role": "tool", "tool_call_id": "call_1", "content": "A."}], tools=[READ])
        turn = req.messages[1]
        assert turn["reasoning_content"] == turn["thinking"] == "Read a.", key
    final = chat(messages=QUESTION + [{"role": "assistant", "content": "Paris.",
                                       "reasoning_content": "Easy."}])
    assert final.messages[1]["thinking"] == "Easy."
    plain = chat(messages=QUESTION + [{"role": "assistant", "content": "Paris."}])
    assert "thinking" not in plain.messages[1] and "reasoning_content" not in plain.messages[1]


def test_reasoning_beside_content_on_a_call_turn_is_not_thinking():
    """gpt-oss's template raises on content and thinking together in a tool-call turn (it
    renders the content as the analysis); other templates still get reasoning_content."""
    req = chat(messages=QUESTION + [
        {"role": "assistant", "content": "Checking.", "tool_calls": [CALL],
         "reasoning_content": "Read a."},
        {"role": "tool", "tool_call_id": "call_1", "content": "A."}], tools=[READ])
    assert req.messages[1]["reasoning_content"] == "Read a."
    assert "thinking" not in req.messages[1]


def test_responses_reasoning_items_go_to_the_turn_after_them():
    req = responses(input=[
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Read a."}, {"type": "other"}, 5]},
        {"type": "function_call", "call_id": "call_1", "name": "read",
         "arguments": '{"path": "a"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "A."},
        {"type": "reasoning", "id": "rs_2", "summary": [], "content": "not a list"},
        {"type": "message", "role": "assistant", "content": "Done."}])
    call_turn, final = req.messages[1], req.messages[3]
    assert call_turn["tool_calls"][0]["id"] == "call_1"
    assert call_turn["reasoning_content"] == call_turn["thinking"] == "Read a."
    assert final == {"role": "assistant", "content": "Done."}  # nothing usable in rs_2


def test_anthropic_thinking_blocks_become_the_turns_reasoning():
    req = messages(messages=QUESTION + [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Paris, surely.", "signature": ""},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "text", "text": "Paris."}]},
        {"role": "user", "content": "Sure?"}])
    assert req.messages[1] == {"role": "assistant", "content": "Paris.",
                               "reasoning_content": "Paris, surely.",
                               "thinking": "Paris, surely."}
