"""/v1/chat/completions, /v1/models and /health against a real server on the real starter,
through the official openai SDK (parsed by its own types) and raw HTTP for error cases."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.greedy import assert_agrees
from tests.helpers import openai_for

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(openai_client) -> openai.OpenAI:
    """The shared OpenAI SDK client (tests/conftest.py), under this module's name."""
    return openai_client


def test_models_lists_local_first_naming_the_real_model(server):
    data = httpx.get(server.v1 + "/models").json()["data"]
    assert [m["id"] for m in data][:2] == ["local", "mlx-kit/SmolLM2-135M-Instruct"]
    assert data[0]["model"] == "mlx-kit/SmolLM2-135M-Instruct"
    assert data[0]["context_window"] == 8192
    assert 0 < data[0]["max_tokens"] <= 8192
    assert data[0]["loaded"] and data[0]["quantization"] == "float32"
    assert data[0]["capabilities"] == {"tools": False, "reasoning": False, "vision": False,
                                       "audio": False, "tool_format": None,
                                       "reasoning_format": None}
    # other models on this machine follow, not loaded (the 4-bit starter: built on first use)
    others = {m["id"]: m for m in data[2:]}
    assert others["mlx-kit/SmolLM2-135M-Instruct-4bit"]["loaded"] is False
    assert others["mlx-kit/SmolLM2-135M-Instruct-4bit"]["capabilities"]["audio"] is False


def test_health_identifies_the_server(server):
    h = server.health()
    assert h["service"] == "mlx-kit" and h["status"] == "ok"
    assert h["pid"] == server.proc.pid
    assert h["model"] == "mlx-kit/SmolLM2-135M-Instruct"


def test_non_streaming_answer(client):
    r = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=30)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.model == "mlx-kit/SmolLM2-135M-Instruct"  # like OpenAI: the model that answered
    assert r.usage.prompt_tokens > 10
    assert r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_real_model_id_is_accepted_too(client):
    r = client.chat.completions.create(model="mlx-kit/SmolLM2-135M-Instruct",
                                       messages=QUESTION, max_tokens=30)
    assert "Paris" in r.choices[0].message.content


def test_streaming_matches_non_streaming_and_ends_with_usage(client):
    full = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=30)
    chunks = list(client.chat.completions.create(
        model="local", messages=QUESTION, max_tokens=30, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_sse_stream_ends_with_done(server):
    with httpx.stream("POST", server.v1 + "/chat/completions", json={
            "model": "local", "messages": QUESTION, "max_tokens": 5, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert r.status_code == 200
    assert lines[-1] == "data: [DONE]"


def test_max_tokens_gives_length(client):
    r = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=2)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 2


def test_max_completion_tokens_is_honoured(client):
    r = client.chat.completions.create(model="local", messages=QUESTION,
                                       max_completion_tokens=3)
    assert r.usage.completion_tokens == 3


def test_stop_string_is_cut_and_reported(client):
    r = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=30,
                                       stop=["Paris"])
    assert "Paris" not in r.choices[0].message.content
    assert r.choices[0].message.content.startswith("The capital of France is")
    assert r.choices[0].finish_reason == "stop"


def test_system_developer_roles_and_content_parts(client):
    msgs = [{"role": "developer", "content": "Answer with one word."},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                         {"type": "text", "text": "of France?"}]}]
    r = client.chat.completions.create(model="local", messages=msgs, max_tokens=20)
    assert "Paris" in r.choices[0].message.content


def test_repeated_prompt_reports_cached_tokens(client):
    msgs = [{"role": "system", "content": "You are a geography tutor. " * 20}, *QUESTION]
    client.chat.completions.create(model="local", messages=msgs, max_tokens=5)
    r = client.chat.completions.create(model="local", messages=msgs, max_tokens=5)
    assert r.usage.prompt_tokens_details.cached_tokens > 100


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("payload, param", [
    ({"model": "local"}, "messages"),
    ({"model": "local", "messages": "hi"}, "messages"),
    ({"model": "local", "messages": []}, "messages"),
    ({"model": "local", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"model": "local", "messages": QUESTION, "max_tokens": "many"}, "max_tokens"),
    ({"model": "local", "messages": QUESTION, "max_tokens": 0}, "max_tokens"),
    ({"model": "local", "messages": QUESTION, "temperature": 7}, "temperature"),
    ({"messages": QUESTION}, "model"),
])
def test_invalid_requests_get_400_error_objects(server, payload, param):
    r = httpx.post(server.v1 + "/chat/completions", json=payload)
    assert r.status_code == 400
    err = _error(r)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


def test_malformed_json_gets_400(server):
    r = httpx.post(server.v1 + "/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert _error(r)["code"] == "invalid_json"


def test_unknown_model_gets_404_listing_available(server):
    r = httpx.post(server.v1 + "/chat/completions", json={"model": "no-such-model", "messages": QUESTION})
    assert r.status_code == 404
    err = _error(r)
    assert err["code"] == "model_not_found" and "local" in err["message"]


def test_n_greater_than_one_is_refused(server):
    r = httpx.post(server.v1 + "/chat/completions",
                   json={"model": "local", "messages": QUESTION, "n": 2})
    assert r.status_code == 400 and _error(r)["param"] == "n"


def test_image_part_on_text_model_is_refused(server):
    msgs = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    r = httpx.post(server.v1 + "/chat/completions", json={"model": "local", "messages": msgs})
    assert r.status_code == 400 and _error(r)["code"] == "unsupported_content"


def test_unknown_route_is_an_error_object(server):
    r = httpx.get(server.v1 + "/nope")
    assert r.status_code == 404 and _error(r)["type"] == "not_found_error"


def test_client_disconnect_stops_generation(server):
    """A client that hangs up mid-stream frees the worker: a 1500-token stream at ~15
    tok/s would hold it for minutes, so the next request must not wait for it."""
    msgs = [{"role": "user", "content": "Write a very long story about a dragon."}]
    before = server.health()["requests_served"]
    with httpx.stream("POST", server.v1 + "/chat/completions", json={
            "model": "local", "messages": msgs, "max_tokens": 1500, "temperature": 1.0,
            "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if '"content"' in line and '"content": ""' not in line:
                break  # got real text: hang up
    t0 = time.monotonic()
    r = httpx.post(server.v1 + "/chat/completions", timeout=120,
                   json={"model": "local", "messages": QUESTION, "max_tokens": 10})
    assert r.status_code == 200
    assert time.monotonic() - t0 < 30
    assert "cancelled" in server.log_text()
    assert server.health()["requests_served"] >= before + 2


def test_api_key_is_required_when_set(keyed_server):
    from tests.helpers import TEST_KEY as key

    s = keyed_server
    r = httpx.get(s.v1 + "/models")
    assert r.status_code == 401 and _error(r)["code"] == "invalid_api_key"
    assert httpx.get(s.v1 + "/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert httpx.get(s.v1 + "/models", headers={"x-api-key": key}).status_code == 200
    assert httpx.get(s.root + "/health").status_code == 200  # probes need no key


# --- sampling parameters, logprobs, formats, tools (through the SDK's own types) ----------

def test_seed_makes_sampling_repeatable(client):
    kw = dict(model="local", messages=QUESTION, max_tokens=12, temperature=1.0, seed=42)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_top_k_one_is_greedy(client):
    greedy = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=12,
                                            temperature=0)
    top1 = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=12,
                                          temperature=1.5, extra_body={"top_k": 1})
    assert top1.choices[0].message.content == greedy.choices[0].message.content


def test_logit_bias_bans_a_token(client, hf_home):
    from tokenizers import Tokenizer

    snap = next((hf_home / "hub" / "models--mlx-kit--SmolLM2-135M-Instruct" / "snapshots").iterdir())
    paris = Tokenizer.from_file(str(snap / "tokenizer.json")).token_to_id("\u0120Paris")
    assert paris is not None
    plain = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=10,
                                           temperature=0)
    assert " Paris" in plain.choices[0].message.content
    r = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=10,
                                       temperature=0, logit_bias={str(paris): -100})
    assert " Paris" not in r.choices[0].message.content


def test_logprobs_and_top_logprobs(client):
    r = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        assert t.token == t.top_logprobs[0].token  # greedy picks the most likely
        assert bytes(t.bytes).decode() == t.token


def test_logprobs_stream(client):
    chunks = list(client.chat.completions.create(
        model="local", messages=QUESTION, max_tokens=6, temperature=0, logprobs=True,
        stream=True))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert tokens and "".join(t.token for t in tokens) == text


CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                                "country": {"type": "string"}},
               "required": ["city", "country"], "additionalProperties": False}


def test_response_format_json_object_answers_a_json_object(client):
    r = client.chat.completions.create(
        model="local", max_tokens=60, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_response_format_json_schema_answer_follows_the_schema_streamed_too(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}
    ask = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    r = client.chat.completions.create(model="local", max_tokens=60, messages=ask,
                                       response_format=fmt)
    answer = json.loads(r.choices[0].message.content)
    assert set(answer) == {"city", "country"} and "Paris" in answer["city"]
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="local", max_tokens=60, messages=ask,
                                                 response_format=fmt, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(streamed) == answer  # greedy: the same constrained answer


@pytest.mark.parametrize("fmt", [
    {"type": "xml"}, {"type": "json_schema", "json_schema": {}},
    # keywords the constraint cannot enforce are refused, never silently dropped
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "object"}}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                    "x-guidance": "x"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}])
def test_response_format_that_cannot_be_honoured_is_refused_not_ignored(server, fmt):
    r = httpx.post(server.v1 + "/chat/completions",
                   json={"model": "local", "messages": QUESTION, "response_format": fmt})
    # param: the field at fault, down to the nested one where the schema names it
    assert r.status_code == 400 and _error(r)["param"].startswith("response_format")


TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def test_forcing_a_tool_call_on_a_model_without_tool_support_is_400(server):
    for choice in ("required", {"type": "function", "function": {"name": "read"}}):
        r = httpx.post(server.v1 + "/chat/completions", json={
            "model": "local", "messages": QUESTION, "tools": TOOLS, "tool_choice": choice})
        assert r.status_code == 400 and _error(r)["param"] == "tool_choice"


def test_an_agent_shaped_request_is_answered_with_its_tool_history_in_the_prompt(client):
    """The one real-model run of what agents send beside the question (tools, tool_choice,
    a tool call and its result in history, reasoning_effort, chat_template_kwargs,
    metadata, unknown fields): answered in text, with the history in the prompt. What
    each field becomes is asserted model-free in tests/server/test_translation.py."""
    history = [
        {"role": "user", "content": "Read notes.txt"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "read", "arguments": '{"path": "notes.txt"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "The capital of France is Paris."},
    ]
    plain = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=10)
    r = client.chat.completions.create(
        model="local", messages=history + QUESTION, max_tokens=10, tools=TOOLS,
        tool_choice="auto", parallel_tool_calls=False, reasoning_effort="low", user="u1",
        store=False, metadata={"k": "v"},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, "frobnicate": True})
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 10  # the tool turns count


# --- /v1/completions (legacy) -------------------------------------------------------------

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_legacy_completion(client):
    r = client.completions.create(model="local", prompt=PROMPT, max_tokens=12, temperature=0)
    assert "Paris" in r.choices[0].text
    assert r.object == "text_completion" and r.model == "mlx-kit/SmolLM2-135M-Instruct"
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0


def test_a_legacy_prompt_beyond_the_window_names_prompt(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="local", prompt="hello " * 9000, max_tokens=4)
    assert exc.value.code == "context_length_exceeded" and exc.value.param == "prompt"


def test_legacy_completion_default_max_tokens_is_16(client):
    r = client.completions.create(model="local", prompt="Once upon a time", temperature=0)
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_legacy_completion_stream_matches(client):
    full = client.completions.create(model="local", prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model="local", prompt=PROMPT, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_legacy_completion_logprobs_and_stop(client):
    r = client.completions.create(model="local", prompt=PROMPT, max_tokens=12, temperature=0,
                                  logprobs=2, stop=["Paris"])
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens).startswith(r.choices[0].text)
    assert all(len(t) == 2 for t in lp.top_logprobs)
    assert "Paris" not in r.choices[0].text and r.choices[0].finish_reason == "stop"


def test_legacy_completion_refuses_what_it_cannot_do(server):
    for extra in ({"prompt": ["a", "b"]}, {"prompt": "a", "echo": True},
                  {"prompt": "a", "suffix": "z"}):
        r = httpx.post(server.v1 + "/completions", json={"model": "local", **extra})
        assert r.status_code == 400 and _error(r)["code"] == "unsupported_value"


def test_non_streaming_client_disconnect_stops_generation(server):
    """Regression: a non-streamed request whose client hung up used to generate to the end
    (the auth middleware wrapped the receive channel, hiding the disconnect)."""
    msgs = [{"role": "user", "content": "Write a very long story about a dragon."}]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.v1 + "/chat/completions", timeout=2, json={
            "model": "local", "messages": msgs, "max_tokens": 1500, "temperature": 1.0})
    t0 = time.monotonic()
    r = httpx.post(server.v1 + "/chat/completions", timeout=120,
                   json={"model": "local", "messages": QUESTION, "max_tokens": 10})
    assert r.status_code == 200
    assert time.monotonic() - t0 < 20


def test_client_leaving_during_prefill_stops_it(server):
    """A ~6000-token prompt takes ~40 s to prefill here; a client that leaves after 2 s
    frees the worker at the next 512-token chunk."""
    long = [{"role": "user", "content": "word " * 6000 + "\nSummarise."}]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.v1 + "/chat/completions", timeout=2,
                   json={"model": "local", "messages": long, "max_tokens": 5})
    t0 = time.monotonic()
    r = httpx.post(server.v1 + "/chat/completions", timeout=120,
                   json={"model": "local", "messages": QUESTION, "max_tokens": 10})
    assert r.status_code == 200
    assert time.monotonic() - t0 < 20
    assert "cancelled during prefill" in server.log_text()


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_out_of_range_seed_is_400_not_500(server, seed):
    r = httpx.post(server.v1 + "/chat/completions",
                   json={"model": "local", "messages": QUESTION, "seed": seed})
    assert r.status_code == 400 and _error(r)["param"] == "seed"


# --- continuous batching --------------------------------------------------------------------

def test_concurrent_requests_are_decoded_together(server):
    """4 streams sent at once all start before any of them ends (they share the batch),
    and greedy decoding gives each the text it gets alone (up to a near-tie: a batch's
    matmuls add in another order, tests/greedy.py)."""
    import threading

    cats = [{"role": "user", "content": "Tell me about cats."}]
    alone = openai_for(server).chat.completions.create(
        model="local", messages=cats, max_tokens=40, temperature=0).choices[0].message.content
    spans: list = [None] * 4

    def one(i: int) -> None:
        first = last = None
        text = ""
        with httpx.stream("POST", server.v1 + "/chat/completions", timeout=180, json={
                "model": "local", "messages": [{"role": "user", "content": "Tell me about cats."}],
                "max_tokens": 40, "temperature": 0, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        if c["delta"].get("content"):
                            first = first or time.monotonic()
                            last = time.monotonic()
                            text += c["delta"]["content"]
        spans[i] = (first, last, text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert all(spans)
    assert max(s[0] for s in spans) < min(s[1] for s in spans)  # overlapping in time
    for span in spans:
        assert_agrees(server, cats, alone, span[2], max_tokens=40)


# --- inputs that used to crash or poison the engine (a new-user try) ------------------------

@pytest.mark.parametrize("bias", [{"99999999": 100}, {"49152": 100}, {"-3": 100}])
def test_logit_bias_outside_the_vocabulary_is_400_not_a_crashed_engine(server, bias):
    # Regression: an out-of-range id crashed the engine process (SIGSEGV / double free),
    # failing every stream beside it; a negative one silently biased vocab-3.
    pid = server.health()["engine_pid"]
    r = httpx.post(server.v1 + "/chat/completions", timeout=60,
                   json={"model": "local", "messages": QUESTION, "logit_bias": bias})
    assert r.status_code == 400 and _error(r)["param"].startswith("logit_bias")
    assert server.health()["engine_pid"] == pid  # still the same engine


def test_top_k_beyond_the_vocabulary_is_400_and_sampling_still_works(server):
    # Regression: the sampler's own error left it broken: every later sampled request got
    # 500 "Attempting to eval an array without a primitive" until a restart.
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": "local", "messages": QUESTION, "temperature": 1, "top_k": 1000000})
    assert r.status_code == 400 and _error(r)["param"] == "top_k"
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": "local", "messages": QUESTION, "temperature": 0.7, "max_tokens": 5})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_template_kwargs_cannot_make_the_prompt_text(server):
    # Regression: chat_template_kwargs {"tokenize": false} made the prompt a list of
    # strings, which failed every request in the batch with it. The renderer's own
    # arguments are now refused as template variables; the server serves on.
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": "local", "messages": QUESTION, "max_tokens": 8,
        "chat_template_kwargs": {"tokenize": False}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "chat_template_kwargs.tokenize"
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": "local", "messages": QUESTION, "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


def test_penalties_give_the_same_text_whatever_was_cached(server):
    # Regression: decoding alone, presence/frequency penalties saw only the uncached part
    # of the prompt, so the same greedy request changed its text once it was cached.
    body = {"model": "local", "max_tokens": 30, "temperature": 0, "presence_penalty": 1.5,
            "frequency_penalty": 1.0, "messages": [{"role": "user", "content":
                                                    "List five vegetables, briefly."}]}
    texts, cached = [], []
    for _ in range(3):
        r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60).json()
        texts.append(r["choices"][0]["message"]["content"])
        cached.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached[-1] > cached[0]  # the later ones did reuse the prompt cache
    assert texts[0] == texts[1] == texts[2]
