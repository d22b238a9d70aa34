"""Parallel tool calls at the protocol level: OpenAI ``parallel_tool_calls``, Anthropic
``disable_parallel_tool_use`` and Gemini (always allowed) reach the engine as
``ChatRequest.parallel_tool_calls``, and a turn with two calls comes back as two calls,
streamed and not, in every protocol.

The engine is a stand-in for a json_tools model that wants to call both tools in one turn
(get_weather, then get_time): what it writes is held to the real grammar of the request
(kit/engine/decode/tool_grammar.py, matched by llguidance over a byte tokenizer, as
tests/engine/test_grammar.py does) when the call is forced, and read by the real parser
(kit/formats/output.py), so "one call" here is what the grammar or the parser cut, not
what a script chose. In-process (the app on a TestClient), no model.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from kit.engine.decode.grammar import tool_call_grammar
from kit.engine.types import Finished, Started, Usage
from kit.formats.output import OutputParser
from kit.formats.select import Detected, load_format
from tests.engine.test_grammar import _bytes_tokenizer
from tests.server.test_metrics import StandInEngine, make_app

WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}
#: what the stand-in model writes after <tool_call>: both calls, as Qwen3's template
#: renders a turn with two tool_calls
BOTH = ('\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>'
        '\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_call>')
ASK = [{"role": "user", "content": "Weather in Paris and the time in UTC?"}]
CALLED = [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "UTC"})]


class TwoCallEngine(StandInEngine):
    """A json_tools model that writes :data:`BOTH` (after the start marker, which an
    unforced turn writes itself), held to the request's grammar when the call is forced,
    parsed by the real parser and streamed five characters at a time; it keeps each
    request it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []
        self.format = load_format(Detected("json_tools", None))
        self.tokenizers = _bytes_tokenizer()

    def capabilities(self) -> dict:
        return {**super().capabilities(), "tools": True, "tool_format": "json_tools"}

    def constrained(self, request, text: str) -> str:
        """The longest start of ``text`` the request's grammar takes, ending where it
        allows EOS (where a real model would have been held to EOS)."""
        from llguidance import LLMatcher

        tools = [t for t in request.tools if not request.force_tool
                 or t["function"]["name"] == request.force_tool]
        grammar = tool_call_grammar("json_tools", tools,
                                    parallel=request.parallel_tool_calls)
        hf, ll = self.tokenizers
        m = LLMatcher(ll, LLMatcher.grammar_from_lark(grammar), log_level=0)
        for i, ch in enumerate(text):
            accepting = m.is_accepting()
            if not all(m.consume_token(t) for t in hf.encode(ch, add_special_tokens=False)):
                assert accepting, f"the grammar refused {text[:i + 1]!r} with no way to end"
                return text[:i]
        assert m.is_accepting()
        return text

    async def generate(self, request):
        self.seen.append(request)
        yield Started(self.model_info.id, 7, 0)
        forced = request.force_tool is not None
        text = self.constrained(request, BOTH) if forced else "<tool_call>" + BOTH
        parser = OutputParser.for_format(self.format, "", tools=request.tools,
                                         in_tool_call=forced,
                                         parallel=request.parallel_tool_calls)
        for i in range(0, len(text), 5):
            for event in parser.feed(text[i:i + 5]):
                yield event
            if parser.stopped:
                break
        for event in parser.finish("stop"):
            yield event
        yield Finished("tool_calls" if parser.tool_calls else "stop", Usage(7, 40),
                       self.model_info.id)


@pytest.fixture
def served():
    engine = TwoCallEngine()
    with TestClient(make_app(engine)) as client:
        yield client, engine


def sse(r) -> list[dict]:
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


# --- OpenAI chat completions ---------------------------------------------------------------

def chat(client, stream: bool, **fields) -> list[tuple[str, dict]]:
    body = {"model": "local", "messages": ASK, "stream": stream, "max_tokens": 200,
            "tools": [{"type": "function", "function": t} for t in (WEATHER, TIME)],
            **fields}
    r = client.post("/v1/chat/completions", json=body)
    if not stream:
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in choice["message"]["tool_calls"]]
    chunks = [c for c in sse(r) if c["choices"]]
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls") or []]
    assert [d["index"] for d in deltas] == list(range(len(deltas)))  # one delta per call
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    return [(d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("parallel", [{}, {"parallel_tool_calls": True}], ids=["absent", "true"])
def test_chat_required_tool_choice_with_parallel_calls_returns_both_calls(served, stream,
                                                                          parallel):
    client, engine = served
    assert chat(client, stream, tool_choice="required", **parallel) == CALLED
    assert engine.seen[-1].parallel_tool_calls is True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", "auto",
                                    {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "auto", "named"])
def test_chat_parallel_tool_calls_false_returns_one_call(served, stream, choice):
    client, engine = served
    assert chat(client, stream, tool_choice=choice, parallel_tool_calls=False) == CALLED[:1]
    assert engine.seen[-1].parallel_tool_calls is False


def test_chat_auto_with_parallel_calls_returns_both_calls(served):
    client, _ = served
    assert chat(client, False, tool_choice="auto") == CALLED


def test_chat_parallel_tool_calls_that_is_not_a_boolean_is_a_400_naming_it(served):
    client, _ = served
    r = client.post("/v1/chat/completions", json={
        "model": "local", "messages": ASK, "parallel_tool_calls": "sometimes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "parallel_tool_calls", r.text


# --- OpenAI Responses ----------------------------------------------------------------------

def responses(client, stream: bool, **fields) -> tuple[list[tuple[str, dict]], dict]:
    body = {"model": "local", "input": ASK[0]["content"], "stream": stream,
            "tools": [{"type": "function", **t} for t in (WEATHER, TIME)], **fields}
    r = client.post("/v1/responses", json=body)
    if stream:
        events = sse(r)
        response = [e for e in events if e["type"] == "response.completed"][0]["response"]
        items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    else:
        assert r.status_code == 200, r.text
        response = r.json()
        items = response["output"]
    return [(i["name"], json.loads(i["arguments"])) for i in items
            if i["type"] == "function_call"], response


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("parallel", [None, True, False])
def test_responses_honour_and_echo_parallel_tool_calls(served, stream, parallel):
    # Regression: the response object said parallel_tool_calls false whatever was asked
    client, engine = served
    fields = {} if parallel is None else {"parallel_tool_calls": parallel}
    calls, response = responses(client, stream, tool_choice="required", **fields)
    assert calls == (CALLED[:1] if parallel is False else CALLED)
    assert response["parallel_tool_calls"] is (parallel is not False)
    assert engine.seen[-1].parallel_tool_calls is (parallel is not False)


# --- Anthropic Messages --------------------------------------------------------------------

def messages(client, stream: bool, choice: dict) -> list[tuple[str, dict]]:
    body = {"model": "local", "max_tokens": 200, "messages": ASK, "stream": stream,
            "tools": [{"name": t["name"], "input_schema": t["parameters"]}
                      for t in (WEATHER, TIME)], "tool_choice": choice}
    r = client.post("/v1/messages", json=body)
    if not stream:
        assert r.status_code == 200, r.text
        assert r.json()["stop_reason"] == "tool_use"
        return [(b["name"], b["input"]) for b in r.json()["content"] if b["type"] == "tool_use"]
    events = sse(r)
    starts = {e["index"]: e["content_block"] for e in events
              if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"}
    partial = {i: "".join(e["delta"]["partial_json"] for e in events
                          if e["type"] == "content_block_delta" and e["index"] == i
                          and e["delta"]["type"] == "input_json_delta") for i in starts}
    assert [e for e in events if e["type"] == "message_delta"][-1]["delta"]["stop_reason"] \
        == "tool_use"
    return [(starts[i]["name"], json.loads(partial[i])) for i in sorted(starts)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_messages_any_tool_choice_returns_both_calls(served, stream):
    client, engine = served
    assert messages(client, stream, {"type": "any"}) == CALLED
    assert engine.seen[-1].parallel_tool_calls is True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "auto"},
                                    {"type": "tool", "name": "get_weather"}],
                         ids=["any", "auto", "tool"])
def test_messages_disable_parallel_tool_use_returns_one_call(served, stream, choice):
    client, engine = served
    assert messages(client, stream, {**choice, "disable_parallel_tool_use": True}) \
        == CALLED[:1]
    assert engine.seen[-1].parallel_tool_calls is False


# --- Gemini --------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_gemini_mode_any_returns_both_calls(served, stream):
    client, engine = served
    body = {"contents": [{"role": "user", "parts": [{"text": ASK[0]["content"]}]}],
            "tools": [{"functionDeclarations": [
                {"name": t["name"], "parametersJsonSchema": t["parameters"]}
                for t in (WEATHER, TIME)]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}
    if stream:
        chunks = sse(client.post("/v1beta/models/local:streamGenerateContent",
                                 params={"alt": "sse"}, json=body))
    else:
        r = client.post("/v1beta/models/local:generateContent", json=body)
        assert r.status_code == 200, r.text
        chunks = [r.json()]
    calls = [p["functionCall"] for c in chunks for p in c["candidates"][0]["content"]["parts"]
             if "functionCall" in p]
    assert [(c["name"], c["args"]) for c in calls] == CALLED
    assert engine.seen[-1].parallel_tool_calls is True
