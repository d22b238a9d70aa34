"""Memory admission against a real server on loopback: the starter under a
``--memory-budget`` of its weights plus KV for ROOM tokens (both read from the starter's
own files, as the server computes them), so that the numbers bite.

A model loads when KV for the first FIT_MIN_CONTEXT tokens of its window fits beside
its weights, so one request alone always has ROOM tokens; a clamp of one request comes
from memory that others hold. A "holder" request (streamed, its end-of-turn tokens banned
so it keeps decoding) reserves all but ``leave`` tokens of the room while the request
under test runs; it is closed (cancelled) afterwards and its reservation comes back.
Every request goes through the official SDK of its protocol."""

from __future__ import annotations

import concurrent.futures
import json
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kit.models.memory import FIT_MIN_CONTEXT, kv_bytes_per_token, weights_bytes
from kit.models.starter import STARTER_ID
from kit.server.adapter import MAX_TOKENS_HEADER
from tests.helpers import anthropic_for, openai_for, start_server, stop, wait_until

ROOM = FIT_MIN_CONTEXT + 200  # tokens of KV the budget leaves beside the weights
CACHE_BYTES = 25 << 20  # --prompt-cache-bytes: two short conversations' caches
STORY = "Write a very long story about a dragon who learns to fly."
#: <|endoftext|>, <|im_start|>, <|im_end|>: banned, the holder never ends on its own
NO_END = {"0": -100, "1": -100, "2": -100}


def starter_folder(hf_home: Path) -> Path:
    name = "models--" + STARTER_ID.replace("/", "--")
    return next((hf_home / "hub" / name / "snapshots").iterdir())


@pytest.fixture(scope="module")
def per_token(hf_home) -> int:
    """The starter's KV bytes per token (2 x 30 layers x 3 KV heads x 64 x f32)."""
    return kv_bytes_per_token(json.loads((starter_folder(hf_home) / "config.json").read_text()))


@pytest.fixture(scope="module")
def tight(hf_home, per_token, tmp_path_factory):
    budget = weights_bytes(starter_folder(hf_home)) + ROOM * per_token
    s = start_server(tmp_path_factory.mktemp("home-tight"), hf_home, "--temperature", "0",
                     "--memory-budget", str(budget), "--prompt-cache-bytes", str(CACHE_BYTES))
    yield s
    stop(s)


def admission(server) -> dict:
    return httpx.get(server.root + "/health", timeout=10).json()["admission"]


def chat_prompt_tokens(server, messages: list) -> int:
    r = openai_for(server).chat.completions.create(model="local", messages=messages,
                                                   max_tokens=1)
    return r.usage.prompt_tokens


@contextmanager
def holding(server, leave: int):
    """A streamed chat request that reserves all but ``leave`` tokens of the room while
    the block runs (admitted: its response headers came, which follow the engine's
    ``Started``); closed at the end, and its reservation waited back."""
    messages = [{"role": "user", "content": "Count to one million."}]
    asked = ROOM - leave - chat_prompt_tokens(server, messages)
    body = {"model": "local", "messages": messages, "max_tokens": asked, "stream": True,
            "logit_bias": NO_END}
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200 and MAX_TOKENS_HEADER not in r.headers
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # it decodes
        yield
    wait_until(lambda: admission(server)["reserved_bytes"] == 0, timeout=120)


def expected_header(granted: int, asked: int) -> str:
    return f"{granted} (clamped from {asked}: memory)"


# -- one request, clamped next to another, on every protocol -----------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_chat_max_tokens_is_clamped_to_the_memory_left_and_says_so(tight, stream):
    client = openai_for(tight)
    messages = [{"role": "user", "content": STORY}]
    prompt = chat_prompt_tokens(tight, messages)
    before = admission(tight)["clamped"]
    with holding(tight, leave=prompt + 6):
        if stream:
            with client.chat.completions.with_streaming_response.create(
                    model="local", messages=messages, max_tokens=4000, stream=True,
                    stream_options={"include_usage": True}) as resp:
                header = resp.headers.get(MAX_TOKENS_HEADER)
                chunks = list(resp.parse())
            finish = next(c.choices[0].finish_reason for c in chunks
                          if c.choices and c.choices[0].finish_reason)
            usage = next(c.usage for c in chunks if c.usage)
        else:
            raw = client.chat.completions.with_raw_response.create(
                model="local", messages=messages, max_tokens=4000)
            header, done = raw.headers.get(MAX_TOKENS_HEADER), raw.parse()
            finish, usage = done.choices[0].finish_reason, done.usage
    assert header == expected_header(6, 4000)
    assert finish == "length" and usage.completion_tokens == 6
    assert admission(tight)["clamped"] == before + 1


@pytest.mark.parametrize("stream", [False, True])
def test_responses_max_output_tokens_is_clamped_and_the_response_is_incomplete(tight, stream):
    client = openai_for(tight)
    prompt = client.responses.create(model="local", input=STORY,
                                     max_output_tokens=1).usage.input_tokens
    with holding(tight, leave=prompt + 5):
        if stream:
            with client.responses.with_streaming_response.create(
                    model="local", input=STORY, max_output_tokens=3000, stream=True) as resp:
                header = resp.headers.get(MAX_TOKENS_HEADER)
                events = list(resp.parse())
            done = events[-1].response
        else:
            raw = client.responses.with_raw_response.create(model="local", input=STORY,
                                                            max_output_tokens=3000)
            header, done = raw.headers.get(MAX_TOKENS_HEADER), raw.parse()
    assert header == expected_header(5, 3000)
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens"
    assert done.usage.output_tokens == 5


@pytest.mark.parametrize("stream", [False, True])
def test_messages_max_tokens_is_clamped_and_stops_with_max_tokens(tight, stream):
    client = anthropic_for(tight)
    messages = [{"role": "user", "content": STORY}]
    usage = client.messages.create(model="local", max_tokens=1, messages=messages).usage
    prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0)  # Anthropic's split
    with holding(tight, leave=prompt + 7):
        if stream:
            with client.messages.with_streaming_response.create(
                    model="local", max_tokens=2000, messages=messages, stream=True) as resp:
                header = resp.headers.get(MAX_TOKENS_HEADER)
                events = list(resp.parse())
            delta = next(e for e in events if e.type == "message_delta")
            stop_reason, output = delta.delta.stop_reason, delta.usage.output_tokens
        else:
            raw = client.messages.with_raw_response.create(model="local", max_tokens=2000,
                                                           messages=messages)
            header, done = raw.headers.get(MAX_TOKENS_HEADER), raw.parse()
            stop_reason, output = done.stop_reason, done.usage.output_tokens
    assert header == expected_header(7, 2000)
    assert stop_reason == "max_tokens" and output == 7


def test_a_request_that_fits_gets_no_clamp_header(tight):
    raw = openai_for(tight).chat.completions.with_raw_response.create(
        model="local", messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
    assert MAX_TOKENS_HEADER not in raw.headers and raw.parse().usage.completion_tokens <= 5


# -- a prompt that cannot fit even alone --------------------------------------------------------

def test_a_prompt_that_alone_cannot_fit_is_a_400_with_the_numbers(tight, per_token):
    import anthropic
    import openai

    long = "memory " * (ROOM + 300)  # under the 8192-token window, over the room
    before = admission(tight)["rejected"]
    with pytest.raises(openai.BadRequestError) as e:
        openai_for(tight).chat.completions.create(
            model="local", messages=[{"role": "user", "content": long}], max_tokens=5)
    err = e.value.body
    assert e.value.status_code == 400 and err["code"] == "insufficient_memory"
    assert err["param"] == "messages"
    message = err["message"]
    assert f"the room is {ROOM} tokens" in message and f"{per_token} bytes/token" in message
    assert "budget" in message and "--memory-budget" in message and "--kv-bits" in message
    with pytest.raises(anthropic.BadRequestError) as e2:
        anthropic_for(tight).messages.create(
            model="local", max_tokens=5, messages=[{"role": "user", "content": long}])
    assert e2.value.status_code == 400 and "does not fit in memory" in str(e2.value)
    assert admission(tight)["rejected"] == before + 2
    ok = openai_for(tight).chat.completions.create(
        model="local", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert ok.choices[0].finish_reason in ("stop", "length")  # the server goes on


def test_a_request_that_sent_no_max_tokens_gets_what_fits_without_a_clamp_header(tight):
    # Regression (review 2026-12-01): a request with no max_tokens reserved the rest of
    # the window, got an X-Mlx-Kit-Max-Tokens header for a value it never sent and was
    # counted as clamped. It gets what fits, silently.
    client = openai_for(tight)
    messages = [{"role": "user", "content": STORY}]
    prompt = chat_prompt_tokens(tight, messages)
    before = admission(tight)["clamped"]
    with holding(tight, leave=prompt + 6):
        raw = client.chat.completions.with_raw_response.create(model="local",
                                                               messages=messages)
        header, done = raw.headers.get(MAX_TOKENS_HEADER), raw.parse()
    assert header is None
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 6
    assert admission(tight)["clamped"] == before


# -- concurrent requests share the budget --------------------------------------------------------

def test_four_concurrent_huge_requests_all_finish_clamped_and_wait_their_turn(tight):
    client = openai_for(tight)
    messages = [{"role": "user", "content": "Say hello to the reader."}]
    prompt = chat_prompt_tokens(tight, messages)
    before = admission(tight)

    def ask(_i: int):
        raw = client.chat.completions.with_raw_response.create(
            model="local", messages=messages, max_tokens=3000)
        return raw.headers.get(MAX_TOKENS_HEADER), raw.parse()

    with holding(tight, leave=prompt + 12):
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(ask, range(4)))
    assert [h for h, _ in results] == [expected_header(12, 3000)] * 4
    assert all(r.choices[0].finish_reason in ("stop", "length")
               and r.usage.completion_tokens <= 12 for _, r in results)
    after = admission(tight)
    assert after["clamped"] == before["clamped"] + 4
    assert after["deferred"] >= before["deferred"] + 1  # the room held one at a time
    assert after["rejected"] == before["rejected"] and after["reserved_bytes"] == 0


# -- the prompt caches' byte bound --------------------------------------------------------------

def test_prompt_cache_bytes_bounds_the_memory_cache(tight):
    client = openai_for(tight)
    # ~200 prompt tokens each: four hold more KV than the bound whatever buffer sizes the
    # caches they were copied from left them (a cache copied from a batch row is as long
    # as its tokens, one grown alone rounds up to 256 tokens)
    convs = [[{"role": "user", "content": f"Tell me about the number {i}: " + " ".join(
        f"{i}.{k}" for k in range(60))}] for i in range(4)]
    for messages in convs:
        client.chat.completions.create(model="local", messages=messages, max_tokens=3)
    state = admission(tight)
    assert state["prompt_cache_max_bytes"] == CACHE_BYTES
    assert 1 <= state["prompt_cache_entries"] < 4  # the oldest were evicted
    assert 0 < state["prompt_cache_bytes"] <= CACHE_BYTES
    again = client.chat.completions.create(model="local", messages=convs[-1], max_tokens=3)
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the newest is kept
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    first = client.chat.completions.create(model="local", messages=convs[0], max_tokens=3)
    # the oldest is gone: only the prefix it shares with a kept one (the system prompt)
    assert first.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - 3


def test_the_default_prompt_cache_bound_is_a_quarter_of_the_room(server, hf_home):
    openai_for(server).chat.completions.create(
        model="local", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    state = admission(server)
    weights = weights_bytes(starter_folder(hf_home))
    assert state["ceiling_source"] == "available"
    assert state["prompt_cache_max_bytes"] == (state["ceiling_bytes"] - weights) // 4
