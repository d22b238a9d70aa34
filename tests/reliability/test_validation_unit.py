"""Model-free tests of the shared request models (kit/server/content.py) and of each
protocol's translation into the engine's ChatRequest: what reaches the chat template, and
which field a malformed shape is reported at."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kit.engine.types import SamplingParams
from kit.server.anthropic import MessagesRequest, _messages as messages_of
from kit.server.anthropic import _tools as messages_tools
from kit.server.content import MAX_DEPTH, excerpt, field_path
from kit.server.errors import APIError
from kit.server.openai_chat import ChatCompletionRequest, to_engine_request
from kit.server.openai_completions import CompletionRequest, _prompt
from kit.server.openai_responses import ResponsesRequest, _messages as responses_of
from kit.server.openai_responses import _tools as responses_tools


def error_at(model, body: dict) -> tuple[str | None, str]:
    """(param, message) of the 400 the server would answer for ``body``."""
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    first = e.value.errors(include_url=False)[0]
    return field_path(first["loc"], body), first["msg"]


def test_field_path_drops_pydantic_union_tags():
    body = {"messages": [{"content": [{"type": "text"}]}]}
    loc = ("body", "messages", 0, "content", "other", 0, "ChatText", "text")
    assert field_path(loc, body) == "messages.0.content.0.text"
    assert field_path(("body", "model"), {}) == "model"  # a missing field
    assert field_path(("body",), None) is None


def test_excerpt_never_quotes_more_than_a_short_piece():
    assert len(excerpt("x" * 1_000_000)) < 70 and excerpt("ok") == "'ok'"


def test_chat_translation_keeps_tools_arguments_and_roles():
    body = ChatCompletionRequest.model_validate({"model": "local", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                       "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f",
                                                          "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "reasoning_effort": "none", "logit_bias": {"7": -100}, "stop": "END"})
    req = to_engine_request(body, SamplingParams(), supports_tools=True)
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[1]["content"] == "ab"
    assert req.messages[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert req.messages[3] == {"role": "tool", "content": "42", "tool_call_id": "c1"}
    assert req.tools[0]["function"]["parameters"] == {"type": "object"}
    assert req.force_tool == "f"
    assert req.template_kwargs == {"reasoning_effort": "none", "enable_thinking": False}
    assert req.params.logit_bias == ((7, -100.0),) and req.params.stop == ("END",)


def test_responses_translation_merges_calls_and_drops_history_items():
    body = ResponsesRequest.model_validate({"model": "local", "instructions": "sys", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\": 2}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "web_search_call", "id": "ws", "status": "completed"}],
        "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]})
    msgs = responses_of(body)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert [c["function"]["name"] for c in msgs[2]["tool_calls"]] == ["f", "g"]
    assert msgs[2]["tool_calls"][1]["function"]["arguments"] == {"a": 2}
    tools, force = responses_tools(body, supports_tools=True)
    assert [t["function"]["name"] for t in tools] == ["f"] and force is None  # hosted: not offered


def test_responses_item_reference_is_refused_because_nothing_is_stored():
    body = ResponsesRequest.model_validate({"model": "local", "input": [
        {"type": "item_reference", "id": "msg_1"}]})
    with pytest.raises(APIError) as e:
        responses_of(body)
    assert e.value.status == 400 and e.value.param == "input.0"


def test_messages_translation_maps_blocks_and_drops_thinking():
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 5, "system": [
        {"type": "text", "text": "S"}], "messages": [
        {"role": "user", "content": "q"},
        {"role": "system", "content": "agents: x"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": ""},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "R"}]}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"}})
    msgs = messages_of(body)
    assert msgs[0] == {"role": "system", "content": "S\n\nagents: x"}
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert msgs[3] == {"role": "tool", "tool_call_id": "t1", "content": "R"}
    assert messages_tools(body, supports_tools=True)[1] == ""  # any -> required


@pytest.mark.parametrize("model,body,param", [
    (ChatCompletionRequest, {"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": ""}}]}]}, "messages.0.tool_calls.0.function.name"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": 5}]},
     "messages.0.content"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}],
                             "tool_choice": "sometimes"}, "tool_choice"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}],
                             "response_format": {"type": "xml"}}, "response_format"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}],
                             "stop": ["s"] * 65}, "stop"),
    (ResponsesRequest, {"input": [{"type": "function_call", "name": "f"}]}, "input.0.call_id"),
    (ResponsesRequest, {"input": "x", "text": {"format": "json"}}, "text.format"),
    (ResponsesRequest, {"input": "x", "tools": [{"type": "function"}]}, "tools.0.name"),
    (MessagesRequest, {"max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]},
     "messages.0.content.0.input"),
    (MessagesRequest, {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                       "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    (MessagesRequest, {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                       "system": [{"type": "image"}]}, "system.0"),
])
def test_malformed_shapes_are_reported_at_the_field(model, body, param):
    assert error_at(model, {"model": "local", **body})[0] == param


def test_free_json_deeper_than_the_limit_is_refused_with_its_path():
    deep: dict = {}
    for _ in range(MAX_DEPTH + 5):
        deep = {"k": deep}
    param, msg = error_at(ChatCompletionRequest, {"model": "local", "messages": [
        {"role": "user", "content": "x"}], "chat_template_kwargs": deep})
    assert param == "chat_template_kwargs" and f"deeper than {MAX_DEPTH}" in msg


def test_unknown_type_errors_do_not_echo_the_input():
    param, msg = error_at(MessagesRequest, {"model": "m", "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "z" * 100_000}]}]})
    assert param == "messages.0.content.0" and len(msg) < 400 and "zzz" not in msg


@pytest.mark.parametrize("prompt,text,ids", [
    ("hi", "hi", None), (["hi"], "hi", None), ([1, 2], None, [1, 2]), ([[3]], None, [3])])
def test_completions_prompt_forms(prompt, text, ids):
    assert _prompt(CompletionRequest.model_validate({"model": "m", "prompt": prompt})) == \
        (text, ids)


def test_resolve_refuses_specs_that_cannot_name_a_model(tmp_path):
    from kit.models.resolve import InvalidModelSpec, resolve_model

    for spec in ("/etc", str(tmp_path), "x" * 1_000_000, "a\x00b"):
        with pytest.raises(InvalidModelSpec) as e:
            resolve_model(spec)
        assert len(e.value.message) < 200
