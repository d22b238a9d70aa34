"""POST /v1/responses against the real server, through the official openai SDK (its
Response types and streaming) and raw HTTP with a Codex-shaped body."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

F32 = "mlx-kit/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(openai_client) -> openai.OpenAI:
    """The shared OpenAI SDK client (tests/conftest.py), under this module's name."""
    return openai_client


def test_response(client):
    r = client.responses.create(model="local", input="What is the capital of France?",
                                max_output_tokens=30)
    assert r.status == "completed" and r.model == F32
    assert "Paris" in r.output_text
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens > 10 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_stream_matches_and_completes(client):
    full = client.responses.create(model="local", input="What is the capital of France?",
                                   max_output_tokens=30)
    events = list(client.responses.create(model="local", input="What is the capital of France?",
                                          max_output_tokens=30, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    for k in ("response.output_item.added", "response.content_part.added",
              "response.output_text.delta", "response.output_text.done",
              "response.content_part.done", "response.output_item.done"):
        assert k in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == full.output_text == events[-1].response.output_text
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_max_output_tokens_is_incomplete(client):
    r = client.responses.create(model="local", input="Tell me a story.", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_streamed_response_cut_by_max_output_tokens_ends_with_response_incomplete(client):
    # Regression: the stream ended with response.completed (status "incomplete"); OpenAI
    # sends response.incomplete. Through the SDK's streaming helper, whose final-response
    # accessor (like OpenAI's own streams) only knows response.completed.
    full = client.responses.create(model="local", input="Tell me a story.", max_output_tokens=3)
    with client.responses.stream(model="local", input="Tell me a story.",
                                 max_output_tokens=3) as stream:
        events = list(stream)
    last = events[-1]
    assert isinstance(last, openai.types.responses.ResponseIncompleteEvent)
    assert "response.completed" not in [e.type for e in events]
    assert last.response.status == "incomplete" == full.status
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output_text == full.output_text
    # the message the cut ended is incomplete too, in the body and in its done event
    assert full.output[-1].status == last.response.output[-1].status == "incomplete"
    done = [e for e in events if e.type == "response.output_item.done"]
    assert done[-1].item.status == "incomplete"
    assert last.response.usage.output_tokens == full.usage.output_tokens == 3


def test_codex_shaped_request_streams_a_complete_sequence(server):
    """Regression guard for Codex: store false, include, reasoning, prompt_cache_key,
    parallel_tool_calls, instructions, developer + user items with parts, history with a
    function call and its output, function tools."""
    body = {
        "model": "gpt-5-codex", "stream": True, "store": False,
        "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "medium", "summary": "auto"},
        "prompt_cache_key": "abc", "parallel_tool_calls": False, "tool_choice": "auto",
        "instructions": "You are a coding agent.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files"}]},
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"command": ["ls"]}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "zzz"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]},
        ],
        "tools": [{"type": "function", "name": "shell", "description": "Run a command", "strict": False,
                   "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}],
    }
    with httpx.stream("POST", server.v1 + "/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        datas = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert datas[0]["type"] == "response.created"
    done = datas[-1]
    assert done["type"] == "response.completed" and done["response"]["status"] == "completed"
    assert done["response"]["output"][0]["content"][0]["text"]
    assert all("sequence_number" in d for d in datas)


def test_unsupported_inputs_are_400(server):
    for extra in ({"previous_response_id": "resp_1"},
                  {"text": {"format": {"type": "xml"}}},
                  {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}):
        body = {"model": "local", "input": "hi", **extra}
        r = httpx.post(server.v1 + "/responses", json=body)
        assert r.status_code == 400 and set(r.json()["error"]) >= {"message", "type"}


def test_engine_errors_name_the_responses_fields_not_chat_ones(server):
    """Regression (A7): an over-window prompt was reported at ``messages`` and a schema the
    constraint cannot enforce at ``response_format``, fields Responses does not have."""
    r = httpx.post(server.v1 + "/responses", timeout=60,
                   json={"model": "local", "input": "word " * 9000})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert err["param"] == "input"
    r = httpx.post(server.v1 + "/responses", timeout=60, json={
        "model": "local", "input": "hi", "text": {"format": {
            "type": "json_schema", "name": "x", "schema": {"not": {"type": "object"}}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format"


def test_text_format_json_schema_constrains_the_answer(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    r = client.responses.create(model="local", input="What is the capital of France?",
                                max_output_tokens=40, text={"format": {
                                    "type": "json_schema", "name": "city", "schema": schema}})
    assert json.loads(r.output_text) == {"city": "Paris"}
    assert r.text.format.type == "json_schema"


def test_sdk_streaming_helper(client):
    with client.responses.stream(model="local", input="What is the capital of France?",
                                 max_output_tokens=30) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and "Paris" in final.output_text


def test_tool_calls_and_reasoning_become_output_items_and_events():
    """The adapter's item builder on engine events a tool-calling reasoning model makes
    (the starter emits neither): a reasoning item, a message, then a function call."""
    from kit.engine.types import ReasoningDelta, TextDelta, ToolCall
    from kit.server.openai_responses import ResponsesRenderer

    items = ResponsesRenderer()
    events = []
    for ev in [ReasoningDelta("Need the weather."), TextDelta("Checking."),
               ToolCall("call_1", "get_weather", '{"city": "Paris"}', 0)]:
        events += items.add(ev)
    events += items.close()
    kinds = [json.loads(e["data"])["type"] for e in events]
    assert [i["type"] for i in items.output] == ["reasoning", "message", "function_call"]
    assert all(i["status"] == "completed" for i in items.output)
    fc = items.output[2]
    assert (fc["call_id"], fc["name"], json.loads(fc["arguments"])) == \
        ("call_1", "get_weather", {"city": "Paris"})
    assert kinds.count("response.output_item.added") == 3
    assert kinds.count("response.output_item.done") == 3
    assert "response.function_call_arguments.done" in kinds
    assert "response.reasoning_text.delta" in kinds
