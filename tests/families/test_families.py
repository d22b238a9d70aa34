"""Every model family end to end through the real server: one row per family x case.

Each family is a 19 MB random llama with the starter's tokenizer behind our own chat
template of the family (tests/families/families.py, tests/data/families/*.jinja), swapped
in on one server (a module-scoped fixture, so pytest runs a family's rows together). What
is tested is the family's format, not what a model chooses to say: calls are forced (``tool_choice`` naming the function; the
grammar writes the call in the family's own markup, kit/engine/decode/grammar.py) and everything
after that is what a user's client gets: the family's parser, the protocol adapters, the
next turn rendered back through the family's template, the prompt cache. The weights only
choose among what the grammar allows, so random ones do (the starter's 538 MB took the
table 325 s here, these 45 s).

The rows that check one call and its next turn ask for one call (``parallel_tool_calls``
false, ``disable_parallel_tool_use``): with parallel calls allowed a random model may repeat
its call until ``max_tokens``. Gemini has no such switch, so its row takes every call the
model makes; ``test_chat_forced_turn_with_parallel_calls_...`` runs the parallel grammar
(the family's call sequence, its markers as special tokens) through the real engine. Cases
a forced call cannot emit (text before or after a call, malformed markup) are the parser
tests' job (tests/formats/, tests/conformance/), and two calls in each family's markup are
tests/engine/test_grammar_parallel.py's, not repeated here.

Each row records what it verified; the module writes the record (JSON) to
``$MLX_KIT_FAMILIES_RECORD`` or the session's temp dir, and bench/families_table.py renders
docs/models.md's table from the committed copy (bench/families.json).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from kit.formats.select import MLX_LM_PARSERS, known, ours
from tests.families.families import FAMILIES, Family, family_model
from tests.helpers import anthropic_for, openai_for, start_server, stop

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        # bounded: behind a key-value format's bare string the model may not stop; at
        # least 3 characters: a random model may close the string at once
        "city": {"type": "string", "minLength": 3, "maxLength": 24}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"]}}}
#: nested objects and non-ASCII strings (enums, so the small model's values are known)
CITIES, MONTHS = ["Zürich", "東京"], ["März", "décembre"]
TRIP = {"type": "function", "function": {
    "name": "plan_trip", "description": "Plan a trip",
    "parameters": {"type": "object", "required": ["destination", "when"], "properties": {
        "destination": {"type": "object", "required": ["city", "days"], "properties": {
            "city": {"type": "string", "enum": CITIES},
            "days": {"type": "integer", "minimum": 1, "maximum": 9}}},
        "when": {"type": "object", "required": ["month"], "properties": {
            "month": {"type": "string", "enum": MONTHS}}}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TRIP_ASK = [{"role": "user", "content": "Plan a trip to Zürich in März."}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
#: the tool's result, one per protocol and different from its first token: each turn 2 is
#: its own conversation, so its cache hit can only come from its own turn 1 (all turn 1s
#: share the same prompt), not from another protocol's turn 2
RESULT = "{} says: sunny, 24 degrees Celsius."
#: a tool result turn in the family's markup (the result, its role/markers, the generation
#: prompt), in starter tokens: at most this many of turn 2's tokens are new
NEW_TURN = 48
MAX = 150  # tokens: every forced call here fits (the grammar ends it, then EOS)

#: family -> {"cases": {protocol: [case, ...]}, "cache": {protocol: [cached, prompt]}}
RECORD: dict[str, dict] = {}


def record(family: Family, protocol: str, case: str) -> None:
    """``case`` passed through ``protocol`` (called at a test's end: reached only on
    success)."""
    entry = RECORD.setdefault(family.name, {"cases": {}, "cache": {}})
    entry["cases"].setdefault(protocol, []).append(case)


def record_cache(family: Family, protocol: str, cached: int, prompt: int) -> None:
    RECORD.setdefault(family.name, {"cases": {}, "cache": {}})["cache"][protocol] = \
        [cached, prompt]


@pytest.fixture(scope="module", autouse=True)
def _write_record(tmp_path_factory):
    yield
    path = os.environ.get("MLX_KIT_FAMILIES_RECORD") or str(
        tmp_path_factory.getbasetemp() / "families.json")
    families = {f.name: {"tool_format": f.tool_format if known(f.tool_format) else None,
                         "parser": parser_module(f.tool_format),
                         "reasoning_format": reasoning_format(f),
                         **RECORD.get(f.name, {"cases": {}, "cache": {}})}
                for f in FAMILIES}
    Path(path).write_text(json.dumps({"families": families}, indent=1, ensure_ascii=False,
                                     sort_keys=True) + "\n")


def parser_module(tool_format: str | None) -> str | None:
    """The module whose parser reads the family's calls (ours first, as kit.formats)."""
    if tool_format and ours(tool_format):
        return f"kit.formats.{tool_format}"
    return f"mlx_lm.tool_parsers.{tool_format}" if tool_format in MLX_LM_PARSERS else None


def reasoning_format(family: Family) -> str | None:
    """What /v1/models must name: Harmony's channels are its reasoning too, named only
    with its parser."""
    if family.reasoning_format == "harmony" and not known("harmony"):
        return None
    return family.reasoning_format


@pytest.fixture(scope="module")
def family_models(hf_home, tiny_world_model, tmp_path_factory) -> dict[str, Path]:
    """Every family's model folder (the random llama behind the family's template)."""
    root = tmp_path_factory.mktemp("models")
    return {f.name: family_model(hf_home, root / f.name, f, tiny_world_model)
            for f in FAMILIES}


@pytest.fixture(scope="module")
def table_server(hf_home, family_models, tmp_path_factory):
    """One greedy server for the whole table: each family swaps its model in (a load, not
    a process: the swap path is what a user's ``mlx-kit swap`` takes too)."""
    s = start_server(tmp_path_factory.mktemp("home-families"), hf_home, "--model",
                     str(family_models[FAMILIES[0].name]), "--temperature", "0")
    yield s
    stop(s)


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def fam(request, table_server, family_models):
    """(family, server): the random llama behind the family's template, greedy, behind
    ``local`` (swapped in on the table's server)."""
    family: Family = request.param
    model = str(family_models[family.name])
    if table_server.health()["model"] != model:
        r = table_server.swap(model)
        assert r.status_code == 200, r.text
    assert table_server.health()["model"] == model
    return family, table_server


def tools_or_skip(fam) -> tuple[Family, object]:
    family, server = fam
    if not known(family.tool_format):
        pytest.skip(f"no parser for {family.tool_format!r} on this branch yet "
                    f"(kit/formats/{family.tool_format}.py); its row runs once it lands")
    return family, server


def check_weather_call(family: Family, call_id: str, name: str, arguments: dict) -> None:
    assert family.id_ok(call_id), f"{family.name} template rejects call id {call_id!r}"
    assert name == "get_weather"
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str) \
        and arguments["city"].strip()


def check_trip(arguments: dict) -> None:
    assert set(arguments) == {"destination", "when"}
    assert arguments["destination"]["city"] in CITIES
    assert 1 <= arguments["destination"]["days"] <= 9
    assert arguments["when"]["month"] in MONTHS


# --- /v1/models ----------------------------------------------------------------------------

def test_models_lists_the_familys_tool_and_reasoning_formats(fam):
    family, server = fam
    [entry] = [m for m in httpx.get(server.v1 + "/models").json()["data"] if m["id"] == "local"]
    caps = entry["capabilities"]
    tool_format = family.tool_format if known(family.tool_format) else None
    assert (caps["tools"], caps["tool_format"]) == (tool_format is not None, tool_format)
    reasoning = reasoning_format(family)
    assert (caps["reasoning"], caps["reasoning_format"]) == (reasoning is not None, reasoning)
    record(family, "models", "capabilities")


def test_a_forced_call_on_a_family_without_a_parser_is_a_400_naming_tool_choice(fam):
    family, server = fam
    if known(family.tool_format):
        pytest.skip(f"{family.tool_format} has a parser: its calls are tested below")
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": "local", "messages": ASK, "tools": [WEATHER], "tool_choice": NAMED,
        "max_tokens": 5})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tool_choice"
    record(family, "models", "no parser: forced call 400")


# --- chat completions ----------------------------------------------------------------------

def test_chat_stream_equals_the_non_streamed_call(fam):
    family, server = tools_or_skip(fam)
    client = openai_for(server)
    kw = dict(model="local", messages=TRIP_ASK, tools=[WEATHER, TRIP], max_tokens=MAX,
              tool_choice={"type": "function", "function": {"name": "plan_trip"}},
              parallel_tool_calls=False)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    [call] = whole.choices[0].message.tool_calls
    assert deltas[0].function.name == call.function.name == "plan_trip"
    assert family.id_ok(deltas[0].id)
    streamed = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(streamed) == json.loads(call.function.arguments)
    check_trip(json.loads(streamed))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        (whole.choices[0].message.content or "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    record(family, "chat", "stream = non-stream, nested + unicode")


def test_chat_call_cut_by_max_tokens_is_never_an_empty_reply(fam):
    family, server = tools_or_skip(fam)
    r = openai_for(server).chat.completions.create(
        model="local", messages=TRIP_ASK, tools=[TRIP], max_tokens=6,
        tool_choice={"type": "function", "function": {"name": "plan_trip"}})
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    for call in choice.message.tool_calls or []:  # a complete call, if any
        check_trip(json.loads(call.function.arguments))
    assert choice.message.tool_calls or (choice.message.content or "").strip(), \
        "a call cut by max_tokens came back as an empty reply"
    record(family, "chat", "cut by max_tokens")


def test_chat_forced_call_and_the_next_turn_with_the_servers_ids_hits_the_cache(fam):
    family, server = tools_or_skip(fam)
    client = openai_for(server)
    first = client.chat.completions.create(
        model="local", messages=ASK, tools=[WEATHER, TIME], tool_choice=NAMED, max_tokens=MAX,
        parallel_tool_calls=False)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and not message.content
    [call] = message.tool_calls
    check_weather_call(family, call.id, call.function.name, json.loads(call.function.arguments))
    record(family, "chat", "call")
    history = ASK + [
        {"role": "assistant", "content": message.content, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": RESULT.format("chat")}]
    r = client.chat.completions.create(model="local", messages=history, tools=[WEATHER, TIME],
                                       max_tokens=8, **family_kwargs(family))
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    cached = r.usage.prompt_tokens_details.cached_tokens
    record_cache(family, "chat", cached, r.usage.prompt_tokens)
    assert_prefix_reused(cached, first.usage.prompt_tokens, r.usage.prompt_tokens)
    record(family, "chat", "next turn")
    # reasoning sent back with the call reaches the template (rendered in a tool loop by
    # the families whose templates keep it, dropped by the others)
    history[1]["reasoning_content"] = "The user wants the weather: call get_weather."
    again = client.chat.completions.create(model="local", messages=history, max_tokens=1,
                                           tools=[WEATHER, TIME], **family_kwargs(family))
    grew = again.usage.prompt_tokens > r.usage.prompt_tokens
    assert grew is family.keeps_reasoning, (again.usage.prompt_tokens, r.usage.prompt_tokens)
    record(family, "chat", "reasoning sent back")


def family_kwargs(family: Family) -> dict:
    return {"extra_body": {"chat_template_kwargs": family.thinking}} if family.thinking else {}


def assert_prefix_reused(cached: int, previous_prompt: int, prompt: int,
                         results: int = 1) -> None:
    """Turn 2 reused turn 1's prompt and the calls (as the template renders them back) from
    the cache: only the tool results' turn is new (``results``: how many)."""
    assert cached >= previous_prompt - 4, \
        f"only {cached} cached tokens; turn 1's prompt was {previous_prompt}"
    assert prompt - cached <= NEW_TURN * results, \
        f"{prompt - cached} of {prompt} tokens uncached: the call was not reused"


def test_chat_forced_turn_with_parallel_calls_returns_only_complete_valid_calls(fam):
    # parallel calls allowed (the default): the grammar takes one or more calls in the
    # family's sequence, its markers special tokens; what the random model picks, each call
    # comes back whole and valid, streamed as not
    family, server = tools_or_skip(fam)
    client = openai_for(server)
    kw = dict(model="local", messages=TRIP_ASK, tools=[WEATHER, TRIP], tool_choice="required",
              max_tokens=MAX)  # tools whose strings are bounded: a random model stops them
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.finish_reason in ("tool_calls", "length") and choice.message.tool_calls
    assert not (choice.message.content or "").strip()
    calls = [(c.function.name, json.loads(c.function.arguments))
             for c in choice.message.tool_calls]
    for c in choice.message.tool_calls:
        args = json.loads(c.function.arguments)
        if c.function.name == "plan_trip":
            check_trip(args)
        else:
            check_weather_call(family, c.id, c.function.name, args)
    ids = [c.id for c in choice.message.tool_calls]
    assert all(family.id_ok(i) for i in ids) and len(set(ids)) == len(ids)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == calls
    record(family, "chat", "parallel calls allowed")


# --- Responses -----------------------------------------------------------------------------

RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"],
                    "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"]} for t in (WEATHER, TIME, TRIP)]


def test_responses_stream_equals_the_non_streamed_call_and_the_next_turn_hits_the_cache(fam):
    family, server = tools_or_skip(fam)
    client = openai_for(server)
    kw = dict(model="local", input=ASK[0]["content"], tools=RESPONSES_TOOLS[:2],
              max_output_tokens=MAX, tool_choice={"type": "function", "name": "get_weather"},
              parallel_tool_calls=False)
    whole = client.responses.create(**kw)
    [item] = [o for o in whole.output if o.type == "function_call"]
    check_weather_call(family, item.call_id, item.name, json.loads(item.arguments))
    events = list(client.responses.create(**kw, stream=True))
    [done] = [e.item for e in events if e.type == "response.output_item.done"
              and e.item.type == "function_call"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert (done.name, json.loads(done.arguments)) == (item.name, json.loads(item.arguments))
    assert json.loads(deltas) == json.loads(item.arguments) and family.id_ok(done.call_id)
    record(family, "responses", "call, stream = non-stream")
    second = client.responses.create(
        model="local", tools=RESPONSES_TOOLS[:2], max_output_tokens=8, input=[
            {"role": "user", "content": ASK[0]["content"]},
            {"type": "function_call", "call_id": item.call_id, "name": item.name,
             "arguments": item.arguments},
            {"type": "function_call_output", "call_id": item.call_id,
             "output": RESULT.format("responses")}])
    assert second.status in ("completed", "incomplete")
    cached = second.usage.input_tokens_details.cached_tokens
    record_cache(family, "responses", cached, second.usage.input_tokens)
    assert_prefix_reused(cached, whole.usage.input_tokens, second.usage.input_tokens)
    record(family, "responses", "next turn")


# --- Anthropic Messages --------------------------------------------------------------------

MESSAGES_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME, TRIP)]


def test_messages_stream_equals_the_non_streamed_call_and_the_next_turn_hits_the_cache(fam):
    family, server = tools_or_skip(fam)
    client = anthropic_for(server)
    kw = dict(model="local", max_tokens=MAX, messages=TRIP_ASK, tools=MESSAGES_TOOLS,
              tool_choice={"type": "tool", "name": "plan_trip",
                           "disable_parallel_tool_use": True})
    whole = client.messages.create(**kw)
    assert whole.stop_reason == "tool_use"
    [block] = [b for b in whole.content if b.type == "tool_use"]
    assert block.name == "plan_trip"
    check_trip(block.input)
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                      and e.delta.type == "input_json_delta")
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert json.loads(partial) == streamed.input == block.input
    assert final.stop_reason == "tool_use"
    record(family, "messages", "call, stream = non-stream, nested + unicode")
    second = client.messages.create(
        model="local", max_tokens=8, tools=MESSAGES_TOOLS, messages=TRIP_ASK + [
            {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                          "content": RESULT.format("messages")}]}])
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    cached = second.usage.cache_read_input_tokens
    record_cache(family, "messages", cached, second.usage.input_tokens + cached)
    assert_prefix_reused(cached, whole.usage.input_tokens + (
        whole.usage.cache_read_input_tokens or 0), second.usage.input_tokens + cached)
    record(family, "messages", "next turn")


# --- Gemini --------------------------------------------------------------------------------

def gemini_body(contents: list, names: list[str] | None, max_tokens: int = MAX) -> dict:
    return {"contents": contents, "generationConfig": {"maxOutputTokens": max_tokens},
            "tools": [{"functionDeclarations": [
                {"name": t["name"], "description": t["description"],
                 "parametersJsonSchema": t["input_schema"]} for t in MESSAGES_TOOLS[:2]]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY" if names else "AUTO",
                                                     **({"allowedFunctionNames": names}
                                                        if names else {})}}}


def test_gemini_stream_equals_the_non_streamed_call_and_the_next_turn_renders(fam):
    family, server = tools_or_skip(fam)
    ask = [{"role": "user", "parts": [{"text": ASK[0]["content"]}]}]
    r = httpx.post(server.root + "/v1beta/models/local:generateContent", timeout=120,
                   json=gemini_body(ask, ["get_weather"]))
    assert r.status_code == 200, r.text
    candidate = r.json()["candidates"][0]
    # Gemini has no switch for parallel calls: a random model may call more than once
    calls = [p["functionCall"] for p in candidate["content"]["parts"] if "functionCall" in p]
    assert calls
    for call in calls:
        check_weather_call(family, call["id"], call["name"], call["args"])
    s = httpx.post(server.root + "/v1beta/models/local:streamGenerateContent", timeout=120,
                   params={"alt": "sse"}, json=gemini_body(ask, ["get_weather"]))
    chunks = [json.loads(line[6:]) for line in s.text.splitlines() if line.startswith("data: ")]
    streamed = [p["functionCall"] for c in chunks for p in c["candidates"][0]["content"]["parts"]
                if "functionCall" in p]
    assert [(c["name"], c["args"]) for c in streamed] == [(c["name"], c["args"]) for c in calls]
    record(family, "gemini", "call, stream = non-stream")
    history = ask + [candidate["content"], {"role": "user", "parts": [{"functionResponse": {
        "id": call["id"], "name": call["name"],
        "response": {"output": RESULT.format("gemini")}}} for call in calls]}]
    second = httpx.post(server.root + "/v1beta/models/local:generateContent", timeout=120,
                        json=gemini_body(history, None, max_tokens=8))
    assert second.status_code == 200, second.text
    usage = second.json()["usageMetadata"]
    cached = usage.get("cachedContentTokenCount", 0)
    record_cache(family, "gemini", cached, usage["promptTokenCount"])
    assert_prefix_reused(cached, r.json()["usageMetadata"]["promptTokenCount"],
                         usage["promptTokenCount"], results=len(calls))
    record(family, "gemini", "next turn")
