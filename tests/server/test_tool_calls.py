"""End-to-end tool calls with a real model whose chat template has tool calls.

The model: the real starter weights (SmolLM2-135M-Instruct) with a ChatML template that
renders tools and tool calls in the json_tools format (tests/data/chatml-tools.jinja; no
tool-calling model can be had offline here). The 135M model does not choose to call tools
by itself, so these tests force calls with ``tool_choice`` (required / named), which the
server honours with a forced start marker and a grammar over the call's body. Everything
the client sees goes through the same path as with any tool-calling model: template,
generation, mlx-lm's tool parser, the protocol adapters.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tokenizers import Tokenizer



WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def api_server(tools_server):
    """The shared SDK clients (tests/conftest.py) talk to this module's tools server."""
    return tools_server


@pytest.fixture(scope="module")
def client(openai_client) -> openai.OpenAI:
    """The shared OpenAI SDK client (tests/conftest.py), under this module's name."""
    return openai_client


def test_the_model_reports_tool_support(tools_server):
    entry = httpx.get(tools_server.v1 + "/models").json()["data"][0]
    assert entry["id"] == "local" and entry["capabilities"]["tools"] is True


def test_named_tool_choice_returns_a_parsed_call(client):
    r = client.chat.completions.create(model="local", messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice=NAMED, max_tokens=60,
                                       parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_streamed_tool_call_matches_the_non_streamed_one(client):
    chunks = list(client.chat.completions.create(
        model="local", messages=ASK, tools=[WEATHER], tool_choice=NAMED, max_tokens=60,
        parallel_tool_calls=False, stream=True, stream_options={"include_usage": True}))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert deltas and all(d.index == 0 for d in deltas)
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0 and not chunks[-1].choices


def test_required_tool_choice_calls_one_of_the_tools_with_valid_arguments(client):
    ask = [{"role": "user", "content": "What time is it in Tokyo?"}]
    r = client.chat.completions.create(model="local", messages=ask, tools=[WEATHER, TIME],
                                       tool_choice="required", max_tokens=60,
                                       parallel_tool_calls=False)
    [call] = r.choices[0].message.tool_calls
    schema = {"get_weather": {"city"}, "get_time": {"timezone"}}[call.function.name]
    assert set(json.loads(call.function.arguments)) == schema


KEYS = {"get_weather": {"city"}, "get_time": {"timezone"}}


def test_required_tool_choice_with_parallel_calls_returns_every_call_streamed_and_not(client):
    # parallel_tool_calls absent (true): the grammar takes one or more calls; greedy, the
    # 135M model calls both tools and then stops by itself
    kw = dict(model="local", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
              max_tokens=120)
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert all(set(json.loads(c.function.arguments)) == KEYS[c.function.name] for c in calls)
    assert len({c.id for c in calls}) == 2
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == \
        [(i, c.function.name, json.loads(c.function.arguments)) for i, c in enumerate(calls)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # the next turn sends both calls and their results back: the template renders them
    history = ASK + [{"role": "assistant", "content": None,
                      "tool_calls": [c.model_dump() for c in calls]}] + [
        {"role": "tool", "tool_call_id": c.id, "content": result}
        for c, result in zip(calls, ["Sunny, 24 degrees Celsius.", "14:05"])]
    second = client.chat.completions.create(model="local", messages=history,
                                            tools=[WEATHER, TIME], max_tokens=20)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens


def test_a_parallel_turn_cut_by_max_tokens_keeps_its_complete_calls_and_no_markup(client):
    # a named tool with parallel calls: the 135M model repeats the call until max_tokens,
    # cut inside the next "<tool_call>" (several tokens in its vocab), which must not come
    # back as content (regression)
    r = client.chat.completions.create(model="local", messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice=NAMED, max_tokens=60)
    assert r.choices[0].finish_reason == "length"
    calls = r.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_weather" and
                         json.loads(c.function.arguments) == {"city": "Paris"} for c in calls)
    assert not r.choices[0].message.content


def test_a_call_cut_off_by_max_tokens_is_length_not_a_broken_call(client):
    r = client.chat.completions.create(model="local", messages=ASK, tools=[WEATHER],
                                       tool_choice=NAMED, max_tokens=4)
    assert r.choices[0].finish_reason == "length"
    assert not r.choices[0].message.tool_calls


def test_second_turn_with_the_tool_result_answers_in_text_prefilling_only_the_result(
        client, tools_server):
    first = client.chat.completions.create(model="local", messages=ASK, tools=[WEATHER, TIME],
                                           tool_choice=NAMED, max_tokens=60,
                                           parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees Celsius."}]
    r = client.chat.completions.create(model="local", messages=history, tools=[WEATHER, TIME],
                                       max_tokens=40)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.content.strip()
    # Everything turn 2 resends is cached — turn 1's prompt (with both tools: a named
    # tool_choice does not change what the template renders) and its call as the template
    # renders it in history (not as generated: no end marker, EOS instead of <|im_end|>\n);
    # only the tool result is prefilled.
    new = "<|im_start|>user\n<tool_response>\nSunny, 24 degrees Celsius.\n</tool_response>" \
          "<|im_end|>\n<|im_start|>assistant\n"
    tokenizer = Tokenizer.from_file(str(tools_server.model / "tokenizer.json"))
    uncached = r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens
    assert uncached == len(tokenizer.encode(new, add_special_tokens=False).ids)


def test_anthropic_tool_choice_returns_a_tool_use_block(tools_server):
    client = anthropic.Anthropic(base_url=tools_server.root, api_key="unused", max_retries=0)
    r = client.messages.create(
        model="local", max_tokens=60, messages=ASK, tool_choice={
            "type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        tools=[{"name": "get_weather", "description": "Get the current weather for a city",
                "input_schema": WEATHER["function"]["parameters"]}])
    assert r.stop_reason == "tool_use"
    [block] = [b for b in r.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == {"city": "Paris"}


def test_responses_tool_choice_returns_a_function_call_item(client):
    r = client.responses.create(
        model="local", input="What is the weather in Paris?", max_output_tokens=60,
        tools=[{"type": "function", "name": "get_weather",
                "parameters": WEATHER["function"]["parameters"]}],
        tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False)
    [item] = [o for o in r.output if o.type == "function_call"]
    assert item.name == "get_weather" and json.loads(item.arguments) == {"city": "Paris"}


NO_ARGS = {"type": "function", "function": {"name": "get_time_utc",
                                            "description": "The current UTC time"}}


@pytest.mark.parametrize("parameters", [None, {}, {"type": "object"}])
def test_a_tool_without_parameters_is_called_with_no_arguments(client, parameters):
    # Regression: an open object let the model invent keys until max_tokens.
    tool = {"type": "function", "function": {**NO_ARGS["function"],
                                             **({"parameters": parameters}
                                                if parameters is not None else {})}}
    r = client.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "What time is it?"}],
        tools=[tool], tool_choice="required", max_tokens=40, parallel_tool_calls=False)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_time_utc" and json.loads(call.function.arguments) == {}
    assert r.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("tools, choice", [
    ([{"type": "function", "function": {"name": "f", "parameters": 5}}], "required"),
    ([{"type": "function", "function": "f"}], NAMED),
    ([{"type": "function", "function": "f"}], {"type": "function", "function": {"name": "f"}}),
    ([{"type": "function", "name": "f"}], "required"),  # the Responses shape
    ([WEATHER], {"type": "function", "function": "get_weather"}),
    ([], "required"),
])
def test_malformed_tools_or_tool_choice_are_a_400_and_do_not_disturb_a_running_stream(
        tools_server, client, tools, choice):
    # Regression: a bad schema raised inside the batch, failing the streams decoding
    # beside it and leaving the bad request without any answer (or a 500).
    stream = client.chat.completions.create(model="local", messages=ASK, max_tokens=20,
                                            stream=True)
    first = next(iter(stream))  # decoding has started
    r = httpx.post(tools_server.v1 + "/chat/completions", timeout=30, json={
        "model": "local", "messages": ASK, "tools": tools, "tool_choice": choice,
        "max_tokens": 5})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(("tools", "tool_choice"))
    rest = list(stream)
    assert rest[-1].choices[0].finish_reason in ("stop", "length") and first.id == rest[0].id
