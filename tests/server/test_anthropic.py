"""POST /v1/messages and /v1/messages/count_tokens against the real server, through the
official anthropic SDK (its own types and streaming helpers) and raw HTTP."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
F32 = "mlx-kit/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(anthropic_client) -> anthropic.Anthropic:
    """The shared Anthropic SDK client (tests/conftest.py: Claude Code's base URL, without
    /v1), under this module's name."""
    return anthropic_client


def test_message(client):
    m = client.messages.create(model="claude-haiku-4-5", max_tokens=30, messages=QUESTION)
    assert m.type == "message" and m.role == "assistant" and m.model == F32
    assert m.content[0].type == "text" and "Paris" in m.content[0].text
    assert m.stop_reason == "end_turn"
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 10
    assert m.usage.output_tokens > 0


def test_stream_matches_and_has_the_event_sequence(client, server):
    full = client.messages.create(model="local", max_tokens=30, messages=QUESTION)
    with client.messages.stream(model="local", max_tokens=30, messages=QUESTION) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == full.content[0].text == final.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    with httpx.stream("POST", server.v1 + "/messages?beta=true", timeout=120, json={
            "model": "local", "max_tokens": 10, "messages": QUESTION, "stream": True}) as r:
        kinds = [ln[7:] for ln in r.iter_lines() if ln.startswith("event: ")]
    assert kinds[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_max_tokens_and_stop_sequences(client):
    m = client.messages.create(model="local", max_tokens=2, messages=QUESTION)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2
    m = client.messages.create(model="local", max_tokens=30, messages=QUESTION,
                               stop_sequences=["Paris"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "Paris"
    assert "Paris" not in m.content[0].text


def test_system_blocks_history_and_claude_code_extras_are_accepted(client):
    m = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=32000,  # Claude Code's default: a cap
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Read notes.txt"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should read it.", "signature": "x"},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "notes.txt"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "The capital of France is Paris."}]},
                {"type": "text", "text": "What does the file say?"}]},
        ],
        tools=[{"name": "read", "description": "Read a file",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
        metadata={"user_id": "u"},
        extra_body={"thinking": {"type": "adaptive"}, "context_management": {"edits": []},
                    "output_config": {"effort": "low"}},
    )
    # the one real-model run of this shape; what each block becomes is asserted model-free
    # (tests/server/test_translation.py)
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.model == F32
    plain = client.messages.count_tokens(model="local", messages=QUESTION)
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > \
        plain.input_tokens + 10  # the system text, tool call and tool result count


def test_count_tokens(client, server):
    n = client.messages.count_tokens(model="claude-haiku-4-5", messages=QUESTION)
    assert 10 < n.input_tokens < 100
    r = httpx.post(server.v1 + "/messages/count_tokens?beta=true",
                   json={"model": "local", "messages": QUESTION, "system": "x " * 50})
    assert r.status_code == 200 and r.json()["input_tokens"] > n.input_tokens + 20


def test_errors_are_anthropic_shaped(server):
    r = httpx.post(server.v1 + "/messages", json={"model": "local", "messages": QUESTION})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    r = httpx.post(server.v1 + "/messages", json={"model": "nobody/nothing", "max_tokens": 5,
                                                  "messages": QUESTION})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    img = [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]
    r = httpx.post(server.v1 + "/messages", json={"model": "local", "max_tokens": 5,
                                                  "messages": img})
    assert r.status_code == 400 and "text-only" in r.json()["error"]["message"]


def test_forcing_a_tool_on_a_model_without_tools_is_400(server):
    r = httpx.post(server.v1 + "/messages", json={
        "model": "local", "max_tokens": 5, "messages": QUESTION,
        "tools": [{"name": "read", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"}})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_claude_code_probes_head_and_get_root(server):
    assert httpx.head(server.root + "/").status_code == 200
    assert httpx.get(server.root + "/").json()["service"] == "mlx-kit"


def test_key_via_x_api_key_or_bearer(keyed_server):
    from tests.helpers import TEST_KEY as k

    s = keyed_server
    body = {"model": "local", "max_tokens": 3, "messages": QUESTION}
    r = httpx.post(s.v1 + "/messages", json=body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.post(s.v1 + "/messages", json=body, headers={"x-api-key": k},
                      timeout=60).status_code == 200
    assert httpx.post(s.v1 + "/messages", json=body, headers={"authorization": f"Bearer {k}"},
                      timeout=60).status_code == 200


def test_stream_event_payloads_are_well_formed(server):
    with httpx.stream("POST", server.v1 + "/messages", timeout=120, json={
            "model": "local", "max_tokens": 10, "messages": QUESTION, "stream": True}) as r:
        datas = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    start = datas[0]
    assert start["type"] == "message_start" and start["message"]["content"] == []
    delta = next(d for d in datas if d["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert delta["usage"]["output_tokens"] > 0


def test_tool_calls_become_tool_use_blocks():
    """The adapter on a parsed tool call (the starter emits none): a tool_use block with the
    arguments as an object, and tool_use history turned back into tool calls."""
    from kit.engine.types import ToolCall
    from kit.server.anthropic import MessagesRequest, _messages, tool_use_block

    block = tool_use_block(ToolCall("call_abc", "read", '{"path": "a.txt"}', 0))
    assert block == {"type": "tool_use", "id": "toolu_call_abc", "name": "read",
                     "input": {"path": "a.txt"}}
    body = MessagesRequest(model="local", max_tokens=5, messages=[
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_call_abc",
                                      "content": "hello"}]}])
    msgs = _messages(body)
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "read",
                                                    "arguments": {"path": "a.txt"}}
    # the engine's id again (templates check it: Mistral's 9 alphanumerics, Kimi's
    # functions.NAME:IDX), so the next turn renders as the cached one did
    assert msgs[1]["tool_calls"][0]["id"] == "call_abc"
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_abc", "content": "hello"}
