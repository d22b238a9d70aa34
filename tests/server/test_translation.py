"""Model-free tests of the translation layer: what each protocol's request becomes in the
engine's ChatRequest (the tools, tool results, template variables and sampling that reach
the chat template), that each protocol's one renderer gives the same answer streamed and
not, and that engine errors name each protocol's own fields. No server, no model: these
replace the real-model "is accepted" smoke tests (review T4), which proved only "not a 4xx".
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kit.engine.types import (
    Finished,
    ReasoningDelta,
    SamplingParams,
    Started,
    TextDelta,
    ToolCall,
    Usage,
)
from kit.errors import InvalidRequest
from kit.server import (anthropic, gemini, gemini_translate, openai_chat, openai_common,
                        openai_responses)
from kit.server.adapter import Renderer
from kit.server.content import field_path
from kit.server.errors import APIError, api_error
from kit.server.gemini_schemas import GenerateContentRequest
from kit.server.openai_common import OPENAI_FIELDS
from kit.server.translate import (
    call_arguments,
    choose_tools,
    flatten,
    output_cap,
    stop_strings,
    thinking_kwargs,
)

DEFAULTS = SamplingParams(temperature=0.2, top_p=0.9, top_k=0, min_p=0.0)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
READ = {"type": "function", "function": {"name": "read", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}


def chat(**body):
    return openai_chat.to_engine_request(
        openai_chat.ChatCompletionRequest.model_validate({"model": "local", **body}),
        DEFAULTS, supports_tools=False, context_window=8192)


# --- Chat Completions ----------------------------------------------------------------------

def test_chat_tools_reach_the_template_and_tool_choice_auto_or_none_forces_nothing():
    req = chat(messages=QUESTION, tools=[READ])
    assert req.tools == [READ] and req.force_tool is None
    auto = chat(messages=QUESTION, tools=[READ], tool_choice="auto", parallel_tool_calls=False)
    assert auto.tools == [READ] and auto.force_tool is None
    none = chat(messages=QUESTION, tools=[READ], tool_choice="none")
    assert none.tools is None and none.force_tool is None  # hidden from the template


def test_chat_history_with_tool_calls_and_results_becomes_template_messages():
    req = chat(tools=[READ], messages=[
        {"role": "user", "content": "Read notes.txt"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "read", "arguments": '{"path": "notes.txt"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "The capital is Paris."},
        {"role": "user", "content": "What does the file say?"}])
    assert req.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "read", "arguments": {"path": "notes.txt"}}}]}
    assert req.messages[2] == {"role": "tool", "content": "The capital is Paris.",
                               "tool_call_id": "call_1"}
    assert req.tools == [READ]


@pytest.mark.parametrize("effort, kwargs, expected", [
    ("low", {"enable_thinking": False}, {"reasoning_effort": "low", "enable_thinking": False}),
    ("low", None, {"reasoning_effort": "low", "enable_thinking": True}),
    ("minimal", None, {"reasoning_effort": "minimal", "enable_thinking": False}),
    ("none", {"reasoning_effort": "x"}, {"reasoning_effort": "x", "enable_thinking": False}),
    (None, {"enable_thinking": True}, {"enable_thinking": True}),
    (None, None, {}),
])
def test_chat_reasoning_effort_becomes_template_variables_unless_the_request_sets_them(
        effort, kwargs, expected):
    body = {"messages": QUESTION}
    if effort is not None:
        body["reasoning_effort"] = effort
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    assert chat(**body).template_kwargs == expected


def test_chat_sampling_fields_reach_the_engine_and_defaults_fill_the_rest():
    p = chat(messages=QUESTION, max_tokens=12, presence_penalty=0.5, frequency_penalty=0.25,
             min_p=0.1, top_k=5, seed=7, stop=["", "END"]).params
    assert (p.presence_penalty, p.frequency_penalty, p.min_p, p.top_k, p.seed) == \
        (0.5, 0.25, 0.1, 5, 7)
    assert (p.temperature, p.top_p, p.max_tokens, p.stop) == (0.2, 0.9, 12, ("END",))
    assert chat(messages=QUESTION, max_completion_tokens=3, max_tokens=9).params.max_tokens == 3


def test_chat_metadata_and_unknown_fields_change_nothing():
    plain = chat(messages=QUESTION, max_tokens=5)
    extras = chat(messages=QUESTION, max_tokens=5, user="u1", store=False,
                  metadata={"k": "v"}, frobnicate=True)
    assert extras == plain


def test_chat_response_format_text_is_free_text_and_json_object_an_object():
    assert chat(messages=QUESTION, response_format={"type": "text"}).response_schema is None
    assert chat(messages=QUESTION, response_format={"type": "json_object"}).response_schema \
        == {"type": "object"}


def test_chat_forcing_a_tool_on_a_model_without_tool_support_names_tool_choice():
    with pytest.raises(InvalidRequest) as e:
        chat(messages=QUESTION, tools=[READ], tool_choice="required")
    assert api_error(e.value, OPENAI_FIELDS).param == "tool_choice"
    assert api_error(e.value, OPENAI_FIELDS).code == "unsupported_value"


# --- Anthropic Messages ----------------------------------------------------------------------

def test_messages_claude_code_request_becomes_one_system_message_tool_turns_and_a_cap():
    body = anthropic.MessagesRequest.model_validate({
        "model": "claude-sonnet-4-5", "max_tokens": 32000, "stop_sequences": ["", "X"],
        "system": [{"type": "text", "text": "You are terse.",
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Read notes.txt"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should read it.", "signature": "x"},
                {"type": "tool_use", "id": "toolu_1", "name": "read",
                 "input": {"path": "notes.txt"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "Paris."}]},
                {"type": "text", "text": "What does the file say?"}]}],
        "tools": [{"name": "read", "description": "Read a file",
                   "input_schema": READ["function"]["parameters"]}],
        "metadata": {"user_id": "u"}, "thinking": {"type": "adaptive"},
        "context_management": {"edits": []}, "output_config": {"effort": "low"}})
    req = anthropic.to_engine_request(body, DEFAULTS, supports_tools=False,
                                      context_window=8192)
    assert req.messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Read notes.txt"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "read", "arguments": {"path": "notes.txt"}}}],
         # the thinking block, where templates read reasoning (history_reasoning)
         "reasoning_content": "I should read it.", "thinking": "I should read it."},
        {"role": "tool", "tool_call_id": "1", "content": "Paris."},
        {"role": "user", "content": "What does the file say?"}]
    assert req.tools == [READ] and req.force_tool is None
    assert req.params.max_tokens is None  # 32000 >= the window: fitted by the engine
    assert req.params.stop == ("X",) and req.params.temperature == 0.2


def test_messages_max_tokens_below_the_window_is_kept_and_sampling_overrides_defaults():
    body = anthropic.MessagesRequest.model_validate({
        "model": "local", "max_tokens": 30, "messages": QUESTION, "temperature": 1,
        "top_k": 3})
    p = anthropic.to_engine_request(body, DEFAULTS, context_window=8192).params
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p) == (30, 1, 3, 0.9)


def test_messages_validation_error_path_has_no_union_branch_names():
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": 5}]}
    with pytest.raises(ValidationError) as e:
        anthropic.MessagesRequest.model_validate(body)
    assert field_path(e.value.errors()[0]["loc"], body) == "messages.0.content"


OBJ = {"a": 1}
USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("model, body, param", [
    (openai_chat.ChatCompletionRequest,
     {"model": "m", "messages": [{"role": "user", "content": OBJ}]}, "messages.0.content"),
    (openai_chat.ChatCompletionRequest, {"model": "m", "messages": USER, "stop": OBJ}, "stop"),
    (openai_chat.ChatCompletionRequest, {"model": "m", "messages": USER, "tool_choice": {}},
     "tool_choice.function"),  # a field really missing is still named
    ("completions", {"model": "m", "prompt": OBJ}, "prompt"),
    (openai_responses.ResponsesRequest, {"model": "m", "input": OBJ}, "input"),
    (openai_responses.ResponsesRequest,
     {"model": "m", "input": [{"role": "user", "content": OBJ}]}, "input.0.content"),
    (anthropic.MessagesRequest, {"model": "m", "max_tokens": 1, "system": OBJ,
                                 "messages": USER}, "system"),
    (anthropic.MessagesRequest, {"model": "m", "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                      "content": OBJ}]}]}, "messages.0.content.0.content"),
], ids=["chat-content", "chat-stop", "chat-tool_choice-missing", "completions-prompt",
        "responses-input", "responses-content", "messages-system", "messages-tool_result"])
def test_an_object_where_text_or_a_list_goes_is_named_without_a_union_tag(model, body, param):
    """An object where a string or a list goes was reported at "messages.0.content.other",
    "stop.other", "prompt.texts": pydantic's union tag read as a missing field."""
    from fastapi.exceptions import RequestValidationError

    from kit.server.errors import _validation_error
    from kit.server.openai_completions import CompletionRequest

    model = CompletionRequest if model == "completions" else model
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    errors = [{**err, "loc": ("body", *err["loc"])} for err in e.value.errors()]
    api = _validation_error(RequestValidationError(errors, body=body))
    assert api.param == param and api.message.startswith(f"{param}: ")


# --- OpenAI Responses ------------------------------------------------------------------------

def responses(**body):
    return openai_responses.to_engine_request(
        openai_responses.ResponsesRequest.model_validate({"model": "local", **body}),
        DEFAULTS, supports_tools=False)


def test_responses_reasoning_effort_instructions_and_limits_reach_the_engine():
    req = responses(input="q", instructions="sys", max_output_tokens=7, temperature=1.5,
                    reasoning={"effort": "minimal", "summary": "auto"})
    assert req.messages == [{"role": "system", "content": "sys"},
                            {"role": "user", "content": "q"}]
    assert req.template_kwargs == {"reasoning_effort": "minimal", "enable_thinking": False}
    assert (req.params.max_tokens, req.params.temperature, req.params.top_p) == (7, 1.5, 0.9)
    assert responses(input="q").template_kwargs == {}


def test_responses_text_format_schema_and_stored_state_refused():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    req = responses(input="q", text={"format": {"type": "json_schema", "name": "c",
                                                "schema": schema}})
    assert req.response_schema == schema
    with pytest.raises(APIError) as e:
        responses(input="q", previous_response_id="resp_1")
    assert e.value.param == "previous_response_id"


# --- Gemini ----------------------------------------------------------------------------------

def gemini_req(**body):
    return gemini_translate.to_engine_request(
        GenerateContentRequest.model_validate(
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], **body}),
        DEFAULTS, supports_tools=True, context_window=8192)


@pytest.mark.parametrize("config, expected", [
    ({"thinkingBudget": 0}, {"enable_thinking": False}),
    ({"thinkingBudget": 512}, {"enable_thinking": True}),
    ({"thinkingLevel": "high"}, {"reasoning_effort": "high", "enable_thinking": True}),
    ({"thinkingLevel": "MINIMAL", "thinkingBudget": 100},
     {"reasoning_effort": "minimal", "enable_thinking": False}),
    ({"includeThoughts": True}, {}),
])
def test_gemini_thinking_config_becomes_template_variables(config, expected):
    req = gemini_req(generationConfig={"thinkingConfig": config})
    assert req.template_kwargs == expected


def test_gemini_function_turns_become_tool_calls_and_tool_messages():
    req = gemini_req(contents=[
        {"role": "user", "parts": [{"text": "weather?"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "w", "args": {"c": "P"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "w",
                                                         "response": {"output": "sun"}}}]}],
        tools=[{"functionDeclarations": [{"name": "w"}]}],
        toolConfig={"functionCallingConfig": {"mode": "ANY"}},
        generationConfig={"maxOutputTokens": 9000, "stopSequences": ["", "Z"]})
    assert req.messages[1]["tool_calls"] == [
        {"id": "call_1_0", "type": "function", "function": {"name": "w", "arguments": {"c": "P"}}}]
    assert req.messages[2] == {"role": "tool", "tool_call_id": "call_1_0", "name": "w",
                               "content": "sun"}
    assert req.tools[0]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert req.force_tool == "" and req.params.max_tokens is None and req.params.stop == ("Z",)




def test_a_gemini_seed_outside_int32_is_refused_naming_it_and_a_negative_one_maps_to_unsigned():
    """Gemini's seed is an int32; mlx's is unsigned. Out of range it was a 500 from
    ``mx.random.seed`` (a negative seed, or one over 64 bits); now the 400 names it."""
    from pydantic import ValidationError

    assert gemini_req(generationConfig={"seed": -1}).params.seed == 2**32 - 1
    assert gemini_req(generationConfig={"seed": 7}).params.seed == 7
    for seed in (2**31, -2**31 - 1, 2**64):
        with pytest.raises(ValidationError, match="generationConfig.seed|generation_config.seed"):
            gemini_req(generationConfig={"seed": seed})


def test_a_nan_gemini_temperature_is_named_not_a_finite_number():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="finite number"):
        gemini_req(generationConfig={"temperature": float("nan")})


def test_a_null_completions_max_tokens_is_openais_default_16_not_unbounded():
    from kit.server.openai_completions import CompletionRequest

    body = {"model": "local", "prompt": "Once upon a time"}
    assert CompletionRequest.model_validate({**body, "max_tokens": None}).max_tokens == 16
    assert CompletionRequest.model_validate(body).max_tokens == 16
    assert CompletionRequest.model_validate({**body, "max_tokens": 3}).max_tokens == 3
# --- one renderer: the streamed answer is the non-streamed one -------------------------------

STARTED = Started(model="real/model", prompt_tokens=20, cached_tokens=5)
EVENTS = [ReasoningDelta("Think"), ReasoningDelta("ing."), TextDelta("Hel"), TextDelta("lo"),
          ToolCall("call_ab", "read", '{"path": "a"}', 0), TextDelta("!")]
FIN = Finished("tool_calls", Usage(20, 9, 5), stop_string=None)


def run(make: type[Renderer] | object, events: list | None = None,
        fin: Finished = FIN) -> tuple[list, object]:
    """(frames of a streamed run, body of a non-streamed run) for the same events."""
    streamed, whole = make(), make()
    frames = streamed.opening()
    for ev in EVENTS if events is None else events:
        frames += streamed.add(ev)
        whole.add(ev)
    return frames + streamed.finish(fin) + streamed.closing(), whole.final(fin)


def datas(frames: list) -> list:
    return [json.loads(f["data"]) for f in frames if f["data"] != "[DONE]"]


def test_chat_stream_and_body_agree():
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "real/model", "system_fingerprint": "mlx-kit"}
    frames, body = run(lambda: openai_chat.ChatRenderer(base, include_usage=True,
                                                        logprobs=False))
    chunks = datas(frames)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    message = body["choices"][0]["message"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"] == "Hello!"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == \
        message["reasoning_content"]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [{k: v for k, v in c.items() if k != "index"} for c in calls] == \
        message["tool_calls"]
    assert chunks[-2]["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == body["usage"] and frames[-1] == {"data": "[DONE]"}


def test_messages_stream_and_body_agree():
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "real/model",
               "content": [], "stop_reason": None, "stop_sequence": None}
    frames, body = run(lambda: anthropic.MessagesRenderer(message, STARTED))
    blocks: list = []
    for d in datas(frames):
        if d["type"] == "content_block_start":
            assert d["index"] == len(blocks)
            blocks.append(dict(d["content_block"]))
        elif d["type"] == "content_block_delta":
            delta, block = d["delta"], blocks[d["index"]]
            if delta["type"] == "input_json_delta":
                block["input"] = json.loads(delta["partial_json"])
            else:
                key = {"text_delta": "text", "thinking_delta": "thinking"}[delta["type"]]
                block[key] += delta[key]
        elif d["type"] == "message_delta":
            assert d["delta"]["stop_reason"] == body["stop_reason"] == "tool_use"
            assert d["usage"] == body["usage"]
    assert blocks == body["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use", "text"]
    assert body["content"][2]["input"] == {"path": "a"} and body["content"][2]["id"] == \
        "toolu_call_ab"  # toolu_ + the engine's id, given back whole in history


def test_responses_stream_and_body_agree():
    frames, body = run(lambda: openai_responses.ResponsesRenderer({"id": "resp_1"}))
    events = datas(frames)
    assert events[-1]["type"] == "response.completed"
    completed = events[-1]["response"]
    # item ids are minted per renderer: compare without them
    strip = [{k: v for k, v in i.items() if k != "id"} for i in completed["output"]]
    assert strip == [{k: v for k, v in i.items() if k != "id"} for i in body["output"]]
    assert {k: v for k, v in completed.items() if k != "output"} == \
        {k: v for k, v in body.items() if k != "output"}
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))


def test_responses_cut_by_max_output_tokens_end_incomplete_streamed_and_not():
    # OpenAI's stream ends with response.incomplete (not response.completed) and marks
    # the item the cut ended incomplete; the body says the same.
    cut = Finished("length", Usage(9, 4, 0, 3), "real/model")
    frames, body = run(lambda: openai_responses.ResponsesRenderer({"id": "resp_1"}),
                       [ReasoningDelta("Hm"), TextDelta("Hel")], cut)
    events = datas(frames)
    assert [e["type"] for e in events][-1] == "response.incomplete"
    assert "response.completed" not in [e["type"] for e in events]
    last = events[-1]["response"]
    for r in (last, body):
        assert r["status"] == "incomplete"
        assert r["incomplete_details"] == {"reason": "max_output_tokens"}
        assert [i["status"] for i in r["output"]] == ["completed", "incomplete"]
        assert r["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    done = [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["completed", "incomplete"]


def test_gemini_stream_and_body_agree():
    frames, body = run(lambda: gemini.GeminiRenderer({"responseId": "r"}, STARTED, True))
    parts = [p for c in frames for p in c["candidates"][0]["content"]["parts"]]
    merged: list = []
    for p in parts:
        if merged and "text" in p and "text" in merged[-1] and \
                p.get("thought") == merged[-1].get("thought"):
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + p["text"]}
        else:
            merged.append(p)
    assert merged == body["candidates"][0]["content"]["parts"]
    assert [c["candidates"][0].get("finishReason") for c in frames][-1] == \
        body["candidates"][0]["finishReason"] == "STOP"
    assert all("finishReason" not in c["candidates"][0] for c in frames[:-1])
    assert frames[-1]["usageMetadata"] == body["usageMetadata"]


def test_gemini_usage_names_image_and_audio_tokens_on_the_last_response_only():
    """promptTokensDetails: the text's tokens, then a vision model's image and audio
    placeholder tokens (each only when there are some), on the last chunk and the body;
    a chunk before the end has the totals it knows and no details. OpenAI's usage has
    ``audio_tokens`` beside ``cached_tokens``."""
    fin = Finished("stop", Usage(20, 9, 5, 0, 8, 4))
    frames, body = run(lambda: gemini.GeminiRenderer({}, STARTED, False), fin=fin)
    assert body["usageMetadata"]["promptTokensDetails"] == [
        {"modality": "TEXT", "tokenCount": 8}, {"modality": "IMAGE", "tokenCount": 8},
        {"modality": "AUDIO", "tokenCount": 4}]
    assert frames[-1]["usageMetadata"] == body["usageMetadata"]
    assert all("promptTokensDetails" not in f["usageMetadata"] for f in frames[:-1])
    assert frames[0]["usageMetadata"]["promptTokenCount"] == 20
    text = run(lambda: gemini.GeminiRenderer({}, STARTED, False))[1]["usageMetadata"]
    assert text["promptTokensDetails"] == [{"modality": "TEXT", "tokenCount": 20}]
    assert openai_common.usage(fin)["prompt_tokens_details"] == {"cached_tokens": 5,
                                                                 "audio_tokens": 4}


# --- errors in each protocol's own field names (A7) -----------------------------------------

@pytest.mark.parametrize("fields, neutral, expected", [
    (OPENAI_FIELDS, "schema", "response_format"),
    (OPENAI_FIELDS, "template_kwargs.x", "chat_template_kwargs.x"),
    (openai_responses.RESPONSES_FIELDS, "schema", "text.format"),
    (openai_responses.RESPONSES_FIELDS, "messages", "input"),
    (openai_responses.RESPONSES_FIELDS, "max_tokens", "max_output_tokens"),
    (gemini_translate.GEMINI_FIELDS, "messages", "contents"),
    (gemini_translate.GEMINI_FIELDS, "tool_choice", "toolConfig.functionCallingConfig"),
    (gemini_translate.GEMINI_FIELDS, "schema", "generationConfig.responseJsonSchema"),
    (anthropic.ANTHROPIC_FIELDS, "tools", "tools"),
])
def test_engine_errors_name_each_protocols_own_field(fields, neutral, expected):
    e = api_error(InvalidRequest("bad", code="invalid_value", field=neutral), fields)
    assert (e.status, e.param, e.code) == (400, expected, "invalid_value")


# --- the shared pieces -----------------------------------------------------------------------

def test_shared_pieces():
    assert thinking_kwargs(None) == {} and thinking_kwargs("none") == {
        "reasoning_effort": "none", "enable_thinking": False}
    assert thinking_kwargs(None, budget=0) == {"enable_thinking": False}
    assert stop_strings(["", "a", ""]) == ("a",) and stop_strings(None) == ()
    assert output_cap(None, 10) is None and output_cap(10, 10) is None
    assert output_cap(9, 10) == 9 and output_cap(9, None) == 9
    assert call_arguments(ToolCall("c", "f", "not json")) == {"_raw": "not json"}
    assert call_arguments(ToolCall("c", "f", "")) == {}
    with pytest.raises(InvalidRequest) as e:
        choose_tools([READ], "named", "write", supports_tools=True)
    assert e.value.field == "tool_choice" and "not in tools" in e.value.message


def test_flatten_joins_text_and_refuses_media_at_its_path():
    msg = openai_chat.ChatMessage.model_validate({"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}]})
    assert flatten(msg.content, "messages.0.content") == "ab"
    assert flatten(None, "x") == "" and flatten("s", "x") == "s"
    media = openai_chat.ChatMessage.model_validate({"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]})
    with pytest.raises(APIError) as e:
        flatten(media.content, "messages.3.content")
    assert (e.value.param, e.value.code) == ("messages.3.content.1", "unsupported_content")
