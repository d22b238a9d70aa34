"""A defined tool's name may not carry the families' call markup (model-free): the chat
template writes it verbatim into ``<tool_call>{"name": ...}``, ``<|call|>``, ``[TOOL_CALLS]``,
``<function=...>`` and a name holding those characters ends the markup early. Found by
trying issue 14 as an attacker: on a Qwen3 (Hermes) model a call forced to the tool named
``</tool_call>`` stopped mid-name and came back as the text ``{"name": "</tool_call>``."""

from __future__ import annotations

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from kit.server import anthropic, openai_chat, openai_responses
from kit.server.errors import _validation_error

USER = [{"role": "user", "content": "x"}]
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}
MARKUP = ["</tool_call>", "<|call|>", "[TOOL_CALLS]", "<function=x>", 'a"b', "a\nb", "a b",
          "<｜tool▁sep｜>", "x}", "a\\b", "tab\there", "nul\x00"]
AGENT_NAMES = ["get_weather", "mcp__github__create_issue", "functions.shell", "ns:tool",
               "fs/read", "read-file", "天气", "apply_patch"]


def bodies(name: str) -> list[tuple[type, dict, str]]:
    """(request model, body, the field a 400 must name) per protocol for tool ``name``."""
    return [
        (openai_chat.ChatCompletionRequest,
         {"model": "m", "messages": USER, "tools": [
             {"type": "function", "function": {"name": name, "parameters": SCHEMA}}]},
         "tools.0.function.name"),
        (openai_responses.ResponsesRequest,
         {"model": "m", "input": "x", "tools": [
             {"type": "function", "name": name, "parameters": SCHEMA}]}, "tools.0.name"),
        (anthropic.MessagesRequest,
         {"model": "m", "max_tokens": 1, "messages": USER, "tools": [
             {"name": name, "input_schema": SCHEMA}]}, "tools.0.name"),
    ]


@pytest.mark.parametrize("name", MARKUP)
def test_a_tool_name_with_call_markup_is_a_400_naming_the_field(name):
    for model, body, param in bodies(name):
        with pytest.raises(ValidationError) as e:
            model.model_validate(body)
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.value.errors()]
        api = _validation_error(RequestValidationError(errors, body=body))
        assert (api.status, api.param) == (400, param), model
        assert api.message.startswith(f"{param}: a tool name may not contain")


@pytest.mark.parametrize("name", AGENT_NAMES)
def test_names_agents_and_mcp_servers_use_are_accepted(name):
    for model, body, _ in bodies(name):
        model.model_validate(body)
