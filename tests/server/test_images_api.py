"""Images through the HTTP side on every protocol (issue 28), model-free: the real app over
a stand-in engine that reports vision, recording what reaches it: multimodal message
content (``{"type": "image"}`` parts in the client's order) and ``ChatRequest.images``
(bytes, media type, size, digest, in message order), streamed and not, through each
protocol's SDK. A text-only model keeps its old 400. The refusals and bounds:
tests/server/test_images_refused_api.py; media.py alone: tests/server/test_media.py; a real
vision model: tests/server/test_vision_model.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.server.images import (
    GIF,
    IMG,
    JPEG,
    PNG,
    WEBP,
    anthropic_sdk,
    b64,
    block,
    chat_body,
    data_url,
    error,
    image_url,
    openai_sdk,
    png_header,
    sha,
    vision,  # noqa: F401 (a fixture)
)
from tests.server.test_adapters_api import RecordingEngine
from tests.server.test_metrics import make_app


# -- what reaches the engine ---------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_chat_image_parts_reach_the_engine_in_order(vision, stream):
    client, engine = vision
    r = client.post("/v1/chat/completions", json=chat_body(
        {"type": "text", "text": "a"}, image_url(PNG), {"type": "text", "text": "b"},
        {"type": "text", "text": "c"}, {"type": "image_url", "image_url": data_url(JPEG)},
        stream=stream))
    assert r.status_code == 200, r.text
    req = engine.seen[-1]
    assert req.messages[0]["content"] == [{"type": "text", "text": "a"}, IMG,
                                          {"type": "text", "text": "bc"}, IMG]
    (png, jpeg) = req.images
    assert png.data == PNG and png.media_type == "image/png" and png.digest == sha(PNG)
    assert (png.width, png.height) == (8, 8)
    assert jpeg.data == JPEG and jpeg.media_type == "image/jpeg" and \
        (jpeg.width, jpeg.height) == (16, 8)


def test_every_format_is_read_by_its_content_not_its_declared_type(vision):
    client, engine = vision
    parts = [image_url(data, "image/png") for data in (PNG, JPEG, GIF, WEBP)]
    assert client.post("/v1/chat/completions", json=chat_body(*parts)).status_code == 200
    assert [i.media_type for i in engine.seen[-1].images] == [
        "image/png", "image/jpeg", "image/gif", "image/webp"]


def test_text_stays_a_string_and_no_images_on_a_vision_model(vision):
    client, engine = vision
    r = client.post("/v1/chat/completions", json=chat_body(
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}))
    assert r.status_code == 200
    assert engine.seen[-1].messages[0]["content"] == "ab" and engine.seen[-1].images == ()


def test_the_openai_sdk_sends_an_image_to_chat_completions(vision):
    client, engine = vision
    sdk = openai_sdk(client)
    out = sdk.chat.completions.create(model="local", max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url",
                                      "image_url": {"url": data_url(PNG)}}]}])
    assert out.choices[0].message.content
    assert engine.seen[-1].images[0].data == PNG


@pytest.mark.parametrize("stream", [False, True])
def test_responses_input_image_in_a_message_and_a_function_call_output(vision, stream):
    client, engine = vision
    sdk = openai_sdk(client)
    inputs = [
        {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                     {"type": "input_image", "image_url": data_url(PNG),
                                      "detail": "auto"}]},
        {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "here"},
            {"type": "input_image", "image_url": data_url(JPEG)}]}]
    if stream:
        with sdk.responses.stream(model="local", input=inputs) as s:
            assert s.get_final_response().status == "completed"
    else:
        assert sdk.responses.create(model="local", input=inputs).status == "completed"
    req = engine.seen[-1]
    assert req.messages[0]["content"] == [{"type": "text", "text": "look"}, IMG]
    tool = req.messages[2]
    assert tool["role"] == "tool" and tool["content"] == [{"type": "text", "text": "here"}, IMG]
    assert [i.data for i in req.images] == [PNG, JPEG]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_image_blocks_and_a_screenshot_in_a_tool_result(vision, stream):
    client, engine = vision
    sdk = anthropic_sdk(client)
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "see"}, block(PNG)]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "shot", "input": {}}]},
        # the image first, the tool_result after: the tool message still comes first
        {"role": "user", "content": [block(GIF), {
            "type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "screen"}, block(JPEG, "image/png")]}]}]
    if stream:
        with sdk.messages.stream(model="local", max_tokens=8, messages=messages) as s:
            s.get_final_message()
    else:
        sdk.messages.create(model="local", max_tokens=8, messages=messages)
    req = engine.seen[-1]
    roles = [m["role"] for m in req.messages]
    assert roles == ["user", "assistant", "tool", "user"]
    assert req.messages[0]["content"] == [{"type": "text", "text": "see"}, IMG]
    assert req.messages[2]["content"] == [{"type": "text", "text": "screen"}, IMG]
    assert req.messages[3]["content"] == [IMG]
    # images in message order (PNG, the tool's JPEG, then GIF), whatever the block order
    assert [i.data for i in req.images] == [PNG, JPEG, GIF]
    assert req.images[1].media_type == "image/jpeg"  # declared image/png: content wins


def test_messages_count_tokens_carries_the_images(vision):
    client, engine = vision
    r = client.post("/v1/messages/count_tokens", json={"model": "local", "messages": [
        {"role": "user", "content": [block(PNG), {"type": "text", "text": "hi"}]}]})
    assert r.status_code == 200 and r.json() == {"input_tokens": 5}
    assert [i.data for i in engine.counted[-1].images] == [PNG]
    assert engine.counted[-1].messages[0]["content"] == [IMG, {"type": "text", "text": "hi"}]


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_inline_images_in_a_user_turn_and_a_function_response(vision, stream):
    from google import genai
    from google.genai import types

    client, engine = vision
    sdk = genai.Client(api_key="unused", http_options=types.HttpOptions(
        base_url="http://testserver", httpx_client=client,
        retry_options=types.HttpRetryOptions(attempts=1)))
    contents = [
        types.Content(role="user", parts=[
            types.Part(text="what"),
            types.Part(inline_data=types.Blob(mime_type="image/png", data=PNG))]),
        types.Content(role="model", parts=[types.Part(function_call=types.FunctionCall(
            name="shot", args={}))]),
        types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            name="shot", response={"output": "ok"}, parts=[types.FunctionResponsePart(
                inline_data=types.FunctionResponseBlob(mime_type="image/webp",
                                                       data=WEBP))]))])]
    if stream:
        assert "".join(c.text or "" for c in sdk.models.generate_content_stream(
            model="local", contents=contents))
    else:
        assert sdk.models.generate_content(model="local", contents=contents).text
    req = engine.seen[-1]
    assert req.messages[0]["content"] == [{"type": "text", "text": "what"}, IMG]
    assert req.messages[2]["role"] == "tool"
    assert req.messages[2]["content"] == [{"type": "text", "text": "ok"}, IMG]
    assert [i.data for i in req.images] == [PNG, WEBP]


# -- a text-only model: the old 400, nothing read ----------------------------------------

@pytest.fixture
def text_only():
    engine = RecordingEngine()
    with TestClient(make_app(engine)) as client:
        yield client, engine


@pytest.mark.parametrize("data", [PNG, png_header(100_000, 100_000), b"junk"])
def test_a_text_only_model_refuses_images_as_before_unread(text_only, data):
    client, _ = text_only
    old = "image content is not supported by this text-only model"
    e = error(client.post("/v1/chat/completions", json=chat_body(
        {"type": "text", "text": "a"}, image_url(data))))
    assert (e["message"], e["param"], e["code"]) == (old, "messages.0.content.1",
                                                     "unsupported_content")
    e = error(client.post("/v1/responses", json={"model": "local", "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(data)}]}]}))
    assert (e["message"], e["param"]) == (old, "input.0.content.0")
    r = client.post("/v1/messages", json={"model": "local", "max_tokens": 8, "messages": [
        {"role": "user", "content": [block(data)]}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == old
    r = client.post("/v1beta/models/local:generateContent", json={"contents": [
        {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png",
                                                   "data": b64(data)}}]}]})
    assert r.status_code == 400
    assert "inlineData parts are not supported by this local text-only model" in r.text
