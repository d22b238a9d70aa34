"""The Gemini API (/v1beta) against the real server, through the official google-genai SDK
(base URL set through its HTTP options) and raw HTTP for what Gemini CLI sends that the
SDK does not (upper-case JSON schema types, no alt=sse, Google's key query parameter)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from google import genai
from google.genai import errors, types


F32 = "mlx-kit/SmolLM2-135M-Instruct"
QUESTION = "What is the capital of France?"


def make_client(root: str, key: str = "unused", version: str | None = None) -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=root, api_version=version, timeout=120_000,
        retry_options=types.HttpRetryOptions(attempts=1)))


@pytest.fixture(scope="module")
def client(server) -> genai.Client:
    return make_client(server.root)


def config(**kw) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(**kw)


def test_generate_content_answers_with_text_and_usage(client):
    r = client.models.generate_content(model="local", contents=QUESTION,
                                       config=config(max_output_tokens=30))
    assert "Paris" in r.text
    [candidate] = r.candidates
    assert candidate.finish_reason == types.FinishReason.STOP
    assert candidate.content.role == "model"
    u = r.usage_metadata
    assert u.prompt_token_count > 10 and u.candidates_token_count > 0
    assert u.total_token_count == u.prompt_token_count + u.candidates_token_count
    assert r.model_version == F32 and r.response_id


def test_stream_matches_generate_content(client):
    full = client.models.generate_content(model="local", contents=QUESTION,
                                          config=config(max_output_tokens=30))
    chunks = list(client.models.generate_content_stream(model="local", contents=QUESTION,
                                                        config=config(max_output_tokens=30)))
    assert len(chunks) > 1
    assert "".join(c.text or "" for c in chunks) == full.text
    assert [c.candidates[0].finish_reason for c in chunks][-1] == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    last = chunks[-1].usage_metadata
    assert last.candidates_token_count == full.usage_metadata.candidates_token_count


def test_max_output_tokens_and_stop_sequences(client):
    r = client.models.generate_content(model="local", contents=QUESTION,
                                       config=config(max_output_tokens=2))
    assert r.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert r.usage_metadata.candidates_token_count == 2
    r = client.models.generate_content(model="local", contents=QUESTION,
                                       config=config(max_output_tokens=30,
                                                     stop_sequences=["Paris"]))
    assert "Paris" not in r.text and r.candidates[0].finish_reason == types.FinishReason.STOP


def test_system_instruction_and_history_are_the_same_prompt_as_over_openai(client, server):
    contents = [types.Content(role="user", parts=[types.Part(text="My name is Ada.")]),
                types.Content(role="model", parts=[types.Part(text="Hello Ada!")]),
                types.Content(role="user", parts=[types.Part(text="What is "),
                                                  types.Part(text="my name?")])]
    r = client.models.generate_content(model="gemini-2.5-flash", contents=contents, config=config(
        system_instruction="You are a helpful assistant.", max_output_tokens=20))
    assert r.model_version == F32 and r.text  # gemini-* names are served by local
    chat = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0).chat.completions
    same = chat.create(model="local", max_tokens=20, messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada!"},
        {"role": "user", "content": "What is my name?"}])
    assert r.usage_metadata.prompt_token_count == same.usage.prompt_tokens
    assert r.text == same.choices[0].message.content  # greedy: the same answer


def test_count_tokens_equals_the_prompt_of_a_generation(client):
    n = client.models.count_tokens(model="local", contents=QUESTION).total_tokens
    r = client.models.generate_content(model="local", contents=QUESTION,
                                       config=config(max_output_tokens=1))
    assert n == r.usage_metadata.prompt_token_count


def test_a_repeated_prompt_reports_cached_tokens(client):
    ask = "Name three colours of the rainbow."
    client.models.generate_content(model="local", contents=ask, config=config(max_output_tokens=5))
    r = client.models.generate_content(model="local", contents=ask,
                                       config=config(max_output_tokens=5))
    u = r.usage_metadata
    assert 0 < u.cached_content_token_count < u.prompt_token_count


def test_json_schema_output_follows_the_schema(client):
    schema = types.Schema(type=types.Type.OBJECT, required=["city", "country"], properties={
        "city": types.Schema(type=types.Type.STRING),
        "country": types.Schema(type=types.Type.STRING)})
    r = client.models.generate_content(model="local", contents=QUESTION, config=config(
        response_mime_type="application/json", response_schema=schema, max_output_tokens=60))
    answer = json.loads(r.text)
    assert set(answer) == {"city", "country"} and all(isinstance(v, str) for v in answer.values())


def test_gemini_cli_classifier_request_with_upper_case_json_schema_types(server):
    # What Gemini CLI sends without -m: JSON mode, responseJsonSchema with Gemini's
    # upper-case type names, thinkingLevel HIGH (harness-facts.md).
    schema = {"type": "OBJECT", "properties": {
        "reasoning": {"type": "STRING"},
        "model_choice": {"type": "STRING", "enum": ["flash", "pro"]}},
        "required": ["reasoning", "model_choice"]}
    r = httpx.post(server.root + "/v1beta/models/gemini-3.5-flash-lite:generateContent",
                   headers={"x-goog-api-key": "unused"}, timeout=120, json={
                       "contents": [{"role": "user", "parts": [{"text": "Pick a model."}]}],
                       "generationConfig": {"responseMimeType": "application/json",
                                            "responseJsonSchema": schema, "maxOutputTokens": 80,
                                            "thinkingConfig": {"thinkingLevel": "HIGH"}}})
    assert r.status_code == 200, r.text
    answer = json.loads(r.json()["candidates"][0]["content"]["parts"][0]["text"])
    assert answer["model_choice"] in ("flash", "pro") and isinstance(answer["reasoning"], str)


def test_sse_stream_has_only_data_lines_so_gemini_cli_never_stalls(server):
    # Regression: keep-alive comment lines (": ping", every 15 s) stalled the @google/genai
    # JS SDK's parser, and Gemini CLI re-sent every request whose answer took longer.
    with httpx.stream("POST", server.root + "/v1beta/models/local:streamGenerateContent",
                      params={"alt": "sse"}, timeout=120, json={
                          "contents": [{"parts": [{"text": QUESTION}]}],
                          "generationConfig": {"maxOutputTokens": 30}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines and all(ln.startswith("data: {") for ln in lines)
    last = json.loads(lines[-1][6:])
    assert last["candidates"][0]["finishReason"] in ("STOP", "MAX_TOKENS")
    assert last["candidates"][0]["content"]["parts"][0]["text"]  # never an empty last part


def test_stream_without_alt_sse_is_one_json_array(server):
    r = httpx.post(server.root + "/v1beta/models/local:streamGenerateContent", timeout=120,
                   json={"contents": [{"parts": [{"text": QUESTION}]}],
                         "generationConfig": {"maxOutputTokens": 10}})
    chunks = r.json()
    assert isinstance(chunks, list) and len(chunks) > 1
    assert chunks[-1]["candidates"][0]["finishReason"] in ("STOP", "MAX_TOKENS")


def test_models_are_listed_in_googles_shape(server):
    # GET /v1/models is OpenAI's list: Google's is under v1beta (Gemini CLI's version)
    client = make_client(server.root, version="v1beta")
    names = [m.name for m in client.models.list()]
    assert names[0] == "models/local" and f"models/{F32}" in names
    m = client.models.get(model="gemini-2.5-pro")
    assert m.name == "models/gemini-2.5-pro" and m.input_token_limit == 8192
    r = httpx.get(server.root + "/v1beta/models/no-such-model", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"


@pytest.mark.parametrize("body, field", [
    ({"generationConfig": {"candidateCount": 2}}, "generationConfig.candidateCount"),
    ({"generationConfig": {"temperature": 5}}, "generationConfig.temperature"),
    ({"generationConfig": {"stopSequences": ["a", "b", "c", "d", "e", "f"]}},
     "generationConfig.stopSequences"),
    ({"generationConfig": {"responseMimeType": "text/x.enum"}},
     "generationConfig.responseMimeType"),
    ({"generationConfig": {"responseModalities": ["AUDIO"]}},
     "generationConfig.responseModalities"),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png",
                                                               "data": "AAAA"}}]}]},
     "contents.0.parts.0.inlineData"),
    ({"contents": [{"role": "robot", "parts": [{"text": "hi"}]}]}, "contents.0.role"),
    ({"contents": []}, "contents"),
    ({"tools": [{"googleSearch": {}}]}, "tools.0.googleSearch"),
    ({"tools": [{"functionDeclarations": [{"name": "bad name"}]}]},
     "tools.0.functionDeclarations.0.name"),
    ({"toolConfig": {"functionCallingConfig": {"mode": "ANY",
                                               "allowedFunctionNames": ["nope"]}}},
     "toolConfig.functionCallingConfig.allowedFunctionNames"),
    ({"cachedContent": "cachedContents/x"}, "cachedContent"),
])
def test_unsupported_or_invalid_fields_are_a_400_in_googles_shape(server, body, field):
    request = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], **body}
    r = httpx.post(server.root + "/v1beta/models/local:generateContent", json=request,
                   timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    assert field in error["message"]
    assert error["details"][0]["fieldViolations"][0]["field"] == field


def test_the_sdk_raises_googles_error_for_a_400_and_an_unknown_model(client):
    with pytest.raises(errors.ClientError) as e:
        client.models.generate_content(model="local", contents=QUESTION,
                                       config=config(candidate_count=2))
    assert e.value.code == 400 and e.value.status == "INVALID_ARGUMENT"
    assert "candidateCount" in e.value.message
    with pytest.raises(errors.ClientError) as e:
        client.models.generate_content(model="no-such-model", contents=QUESTION)
    assert e.value.code == 404 and e.value.status == "NOT_FOUND"


def test_methods_not_served_are_a_404_in_googles_shape(server):
    r = httpx.post(server.root + "/v1beta/models/local:batchEmbedContents", json={}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    assert "batchEmbedContents" in r.json()["error"]["message"]


def test_invalid_json_body_is_a_400_not_a_500(server):
    r = httpx.post(server.root + "/v1beta/models/local:generateContent", content=b"{nope",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_api_key_by_header_bearer_or_query_and_401_otherwise(keyed_server):
    from tests.helpers import TEST_KEY as s3cret

    ok = make_client(keyed_server.root, key=s3cret)  # x-goog-api-key
    assert ok.models.count_tokens(model="local", contents="hi").total_tokens > 0
    url = keyed_server.root + "/v1beta/models/local:countTokens"
    body = {"contents": [{"parts": [{"text": "hi"}]}]}
    assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {s3cret}"}).status_code == 200
    assert httpx.post(url + f"?key={s3cret}", json=body).status_code == 200
    for headers in ({}, {"x-goog-api-key": "wrong"}):
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    wrong = make_client(keyed_server.root, key="wrong")
    with pytest.raises(errors.ClientError) as e:
        wrong.models.generate_content(model="local", contents="hi")
    assert e.value.code == 401
    log = keyed_server.log_text()
    assert "key=REDACTED" in log and s3cret not in log  # the key never reaches the log


# Function calling: the starter's weights behind a ChatML template with tool calls
# (tests/data/chatml-tools.jinja, as in test_tool_calls.py); the 135M model does not call
# tools by itself, so calls are forced through toolConfig mode ANY.
DATA = __import__("pathlib").Path(__file__).parent.parent / "data"
WEATHER = {"name": "get_weather", "description": "Get the current weather for a city",
           "parametersJsonSchema": {"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]}}
TIME = {"name": "get_time", "description": "Get the current time in a timezone",
        "parameters": {"type": "OBJECT", "properties": {"timezone": {"type": "STRING"}},
                       "required": ["timezone"]}}  # Gemini's own Schema, upper-case types
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def tools_client(tools_server):
    """The Gemini SDK on the session's ``tools_server`` (as test_tool_calls.py uses)."""
    return make_client(tools_server.root)


def tool_config(mode: str, names: list[str] | None = None) -> types.GenerateContentConfig:
    return config(
        max_output_tokens=60,
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration.model_validate(WEATHER),
                                                 types.FunctionDeclaration.model_validate(TIME)])],
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode=mode, allowed_function_names=names)))


def test_mode_any_with_one_allowed_name_returns_only_calls_to_that_function(tools_client):
    # Gemini has no switch for parallel calls, so a forced turn may hold several; with one
    # function allowed the 135M model repeats its call until max_output_tokens: every call
    # comes back whole, and the cut one's markup is no text
    r = tools_client.models.generate_content(model="local", contents=ASK,
                                             config=tool_config("ANY", ["get_weather"]))
    calls = r.function_calls
    assert calls and all(c.name == "get_weather" and c.args == {"city": "Paris"} and c.id
                         for c in calls)
    assert len({c.id for c in calls}) == len(calls)
    assert not [p.text for p in r.candidates[0].content.parts if p.text]
    assert r.candidates[0].finish_reason in (types.FinishReason.STOP,
                                             types.FinishReason.MAX_TOKENS)


def test_mode_any_calls_declared_functions_with_arguments_of_their_schemas(tools_client):
    r = tools_client.models.generate_content(model="local", contents="What time is it in Tokyo?",
                                             config=tool_config("ANY"))
    assert r.function_calls
    for call in r.function_calls:
        assert set(call.args) == {"get_weather": {"city"}, "get_time": {"timezone"}}[call.name]


def test_streamed_function_calls_come_whole_one_per_chunk_as_not_streamed(tools_client):
    cfg = tool_config("ANY", ["get_weather"])
    whole = tools_client.models.generate_content(model="local", contents=ASK, config=cfg)
    chunks = list(tools_client.models.generate_content_stream(
        model="local", contents=ASK, config=cfg))
    per_chunk = [chunk.function_calls or [] for chunk in chunks]
    assert all(len(calls) <= 1 for calls in per_chunk)
    assert [(c.name, c.args) for calls in per_chunk for c in calls] == \
        [(c.name, c.args) for c in whole.function_calls]
    assert chunks[-1].candidates[0].finish_reason == whole.candidates[0].finish_reason


def test_mode_none_answers_in_text(tools_client):
    r = tools_client.models.generate_content(model="local", contents=ASK,
                                             config=tool_config("NONE"))
    assert not r.function_calls and r.text


def test_the_function_response_turn_is_answered_in_text(tools_client):
    first = tools_client.models.generate_content(model="local", contents=ASK,
                                                 config=tool_config("ANY", ["get_weather"]))
    call = first.function_calls[0]
    history = [
        types.Content(role="user", parts=[types.Part(text=ASK)]),
        first.candidates[0].content,
        types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            id=call.id, name=call.name, response={"output": "Sunny, 24 degrees Celsius."}))])]
    r = tools_client.models.generate_content(model="local", contents=history,
                                             config=tool_config("AUTO"))
    assert r.text and not r.function_calls
    # everything but the function response came from turn 1's cache
    u = r.usage_metadata
    assert u.cached_content_token_count > first.usage_metadata.prompt_token_count


@pytest.fixture(scope="module")
def think_client(think_server):
    """The starter behind a thinking template (tests/data/chatml-think.jinja: the
    generation prompt opens <think>), as in test_thinking_cache.py."""
    return make_client(think_server.root)


def test_reasoning_comes_as_thought_parts_only_when_include_thoughts(think_client):
    # (seeded sampling: greedy, the 135M model never trained on <think> ends at once)
    sampling = dict(max_output_tokens=16, temperature=1.5, seed=5)
    ask = "Think step by step: what is 2+2?"
    shown = think_client.models.generate_content(model="local", contents=ask, config=config(
        thinking_config=types.ThinkingConfig(include_thoughts=True), **sampling))
    parts = shown.candidates[0].content.parts
    thoughts = [p.text for p in parts if p.thought]
    assert thoughts and thoughts[0]  # what the model wrote inside <think>
    hidden = think_client.models.generate_content(model="local", contents=ask,
                                                  config=config(**sampling))
    assert not any(p.thought for p in hidden.candidates[0].content.parts)
    assert hidden.usage_metadata.candidates_token_count == \
        shown.usage_metadata.candidates_token_count  # the same generation, thoughts hidden
