"""Images and audio refused through the HTTP side (issue 28), model-free, on a stand-in
engine that reports vision: each bound (count, bytes, pixels, format, whole file) is a 400
naming the part's path, a decompression bomb is refused from its header, remote URLs and
files are never read, images go only in user and tool messages, files and documents stay
refused, audio is bounded then refused. What is accepted: tests/server/test_images_api.py."""

from __future__ import annotations

import time

import pytest

from tests.server.images import (
    GIF,
    PNG,
    b64,
    block,
    chat_body,
    data_url,
    error,
    image,
    image_url,
    noise_png,
    png_header,
    vision,  # noqa: F401 (a fixture)
    vision_client,
    wav,
)


# -- bounds: each a 400 naming the part ------------------------------------------------------

def test_an_image_over_max_image_bytes_is_refused_naming_the_part():
    client, engine = vision_client(max_image_bytes=len(PNG) - 1)
    e = error(client.post("/v1/chat/completions", json=chat_body(
        {"type": "text", "text": "a"}, image_url(PNG))))
    assert e["param"] == "messages.0.content.1" and e["code"] == "image_too_large"
    assert e["message"].startswith("messages.0.content.1: ") and \
        "--max-image-bytes" in e["message"]
    assert engine.seen == []


def test_the_base64_length_is_bounded_before_it_is_decoded():
    client, _ = vision_client(max_image_bytes=1000)
    # not even base64: refused for its length, never decoded
    e = error(client.post("/v1/chat/completions", json=chat_body(
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "!" * 5000}})))
    assert e["code"] == "image_too_large"


def test_an_image_over_max_image_pixels_is_refused_from_its_header():
    client, _ = vision_client(max_image_pixels=63)
    e = error(client.post("/v1/responses", json={"model": "local", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"},
                                     {"type": "input_image", "image_url": data_url(PNG)}]}]}))
    assert e["param"] == "input.0.content.2" and e["code"] == "image_too_large"
    assert "8x8 pixels" in e["message"] and "--max-image-pixels" in e["message"]


def test_more_images_than_max_images_is_refused_at_the_first_one_too_many():
    client, _ = vision_client(max_images=2)
    e = error(client.post("/v1/chat/completions", json={"model": "local", "messages": [
        {"role": "user", "content": [image_url(PNG), image_url(PNG)]},
        {"role": "user", "content": [image_url(GIF)]}]}))
    assert e["param"] == "messages.1.content.0" and e["code"] == "too_many_images"


# pytest resets warning filters per test: the one media.py sets (Pillow's warning is noise
# beside our own bound) is set again here
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("size", [(100_000, 100_000), (10_000, 10_000), (8_000, 8_000)])
def test_a_decompression_bomb_is_a_fast_400_never_decoded(vision, size):
    # 10^10 pixels: past Pillow's own error; 10^8: its warning; 6.4x10^7: only our bound
    client, engine = vision
    start = time.monotonic()
    r = client.post("/v1/messages", json={"model": "local", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x"},
                                     block(png_header(*size))]}]})
    assert time.monotonic() - start < 2
    assert r.status_code == 400 and r.json()["type"] == "error"
    message = r.json()["error"]["message"]
    assert message.startswith("messages.0.content.1: the image") and "pixels" in message
    assert engine.seen == []


def test_a_bomb_is_a_400_even_where_warnings_are_errors(vision):
    import warnings

    client, _ = vision
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = error(client.post("/v1/chat/completions", json=chat_body(
            image_url(png_header(10_000, 10_000)))))
    assert e["code"] == "image_too_large"


@pytest.mark.parametrize("data,why", [
    (noise_png()[:8000], "truncated"),
    (b"hello, not an image at all", "not a PNG"),
    (image("BMP"), "not a PNG"),
])
def test_corrupt_truncated_or_unsupported_images_are_invalid_image(vision, data, why):
    client, _ = vision
    r = client.post("/v1beta/models/local:generateContent", json={"contents": [
        {"role": "user", "parts": [{"text": "a"},
                                   {"inlineData": {"mimeType": "image/png", "data": b64(data)}}]}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith("contents.0.parts.1.inlineData: the image")
    assert why in err["message"]


@pytest.mark.parametrize("url,says", [
    ("https://example.com/cat.png", "remote image URLs are not fetched"),
    ("http://127.0.0.1:8090/x.png", "remote image URLs are not fetched"),
    ("file:///etc/passwd", "not read from the server's disk"),
    ("/etc/passwd", "not read from the server's disk"),
    ("data:image/png,rawbytes", "must be base64-encoded"),
    ("data:image/png;base64,@@@@", "not valid base64"),
    ("ftp://x/y.png", "must be a data URL"),
])
def test_image_urls_other_than_base64_data_urls_are_refused(vision, url, says):
    client, _ = vision
    e = error(client.post("/v1/chat/completions", json=chat_body(
        {"type": "image_url", "image_url": {"url": url}})))
    assert e["param"] == "messages.0.content.0" and says in e["message"]


@pytest.mark.parametrize("source,says", [
    ({"type": "url", "url": "https://example.com/a.png"}, "remote image URLs are not fetched"),
    ({"type": "file", "file_id": "file_123"}, "file ids are not supported"),
    ({"type": "base64", "media_type": "image/png"}, "non-empty base64"),
])
def test_messages_image_sources_that_are_not_inline_are_refused(vision, source, says):
    client, _ = vision
    r = client.post("/v1/messages", json={"model": "local", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "image", "source": source}]}]})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("messages.0.content.0: ")
    assert says in r.json()["error"]["message"]


@pytest.mark.parametrize("uri,says", [
    ("file:///etc/passwd", "not read from the server's disk"),
    ("/home/me/a.png", "not read from the server's disk"),
    ("https://generativelanguage.googleapis.com/v1beta/files/x", "not fetched"),
    ("files/abc", "file ids are not supported"),
])
def test_gemini_file_data_is_refused(vision, uri, says):
    client, _ = vision
    r = client.post("/v1beta/models/local:generateContent", json={"contents": [
        {"role": "user", "parts": [{"fileData": {"mimeType": "image/png", "fileUri": uri}}]}]})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("contents.0.parts.0.fileData: ")
    assert says in r.json()["error"]["message"]


@pytest.mark.parametrize("uri,says", [
    ("file:///etc/passwd", "not read from the server's disk"),
    ("https://example.com/a.png", "not fetched"),
    ("files/abc", "file ids are not supported"),
])
def test_gemini_file_data_in_a_function_response_is_refused_naming_it(vision, uri, says):
    """Regression: a fileData part inside functionResponse.parts was a 500 (its reader
    was called with the wrong arguments) instead of the refusal a user turn's gets."""
    client, _ = vision
    r = client.post("/v1beta/models/local:generateContent", json={"contents": [
        {"role": "user", "parts": [{"functionResponse": {
            "name": "shot", "response": {"output": "ok"},
            "parts": [{"fileData": {"mimeType": "image/png", "fileUri": uri}}]}}]}]})
    assert r.status_code == 400
    where = "contents.0.parts.0.functionResponse.parts.0.fileData"
    assert r.json()["error"]["message"].startswith(where + ": ")
    assert says in r.json()["error"]["message"]


@pytest.mark.parametrize("role", ["system", "developer", "assistant"])
def test_an_image_outside_user_and_tool_messages_is_refused(vision, role):
    client, _ = vision
    e = error(client.post("/v1/chat/completions", json={"model": "local", "messages": [
        {"role": role, "content": [image_url(PNG)]}, {"role": "user", "content": "hi"}]}))
    assert e["param"] == "messages.0.content.0" and e["code"] == "unsupported_content"
    assert "cannot carry images" in e["message"]


@pytest.mark.parametrize("body,where,says", [
    ({"systemInstruction": {"parts": [{"inlineData": {"mimeType": "image/png",
                                                      "data": b64(PNG)}}]}},
     "systemInstruction.parts.0.inlineData", "a system message"),
    ({"contents": [{"role": "user", "parts": [{"text": "a"}]}, {"role": "model", "parts": [
        {"inlineData": {"mimeType": "image/png", "data": b64(PNG)}}]}]},
     "contents.1.parts.0.inlineData", "an assistant message"),
])
def test_gemini_images_outside_user_turns_are_refused(vision, body, where, says):
    client, _ = vision
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], **body}
    r = client.post("/v1beta/models/local:generateContent", json=body)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith(where + ": " + says + " cannot carry images")


def test_files_and_documents_stay_refused_on_a_vision_model(vision):
    client, _ = vision
    e = error(client.post("/v1/chat/completions", json=chat_body(
        {"type": "file", "file": {"file_id": "f"}})))
    assert e["message"] == "messages.0.content.0: file content is not supported by this model"
    r = client.post("/v1/messages", json={"model": "local", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "document", "source": {
            "type": "text", "media_type": "text/plain", "data": "x"}}]}]})
    assert r.status_code == 400 and "document content is not supported" in r.text


# -- audio: bounded, then refused ------------------------------------------------------------

def _audio_part(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}}


@pytest.mark.parametrize("data,fmt,code,says", [
    (wav(), "wav", "unsupported_content", "audio content is not supported by this model"),
    (b"ID3" + b"\x00" * 64, "mp3", "unsupported_content", "audio content is not supported"),
    (wav(frames=601, rate=1), "wav", "audio_too_long", "601 s long"),
    (wav()[:-300], "wav", "invalid_audio", "truncated"),
    (b"not a wave file", "wav", "invalid_audio", "not a WAV file"),
])
def test_chat_input_audio_is_bounded_then_refused(vision, data, fmt, code, says):
    client, engine = vision
    e = error(client.post("/v1/chat/completions", json=chat_body(
        {"type": "text", "text": "a"}, _audio_part(data, fmt))))
    assert (e["param"], e["code"]) == ("messages.0.content.1", code)
    assert says in e["message"] and engine.seen == []


@pytest.mark.parametrize("data,code", [(wav(), "unsupported_content"),
                                       (wav(frames=601, rate=1), "audio_too_long")])
def test_gemini_inline_audio_is_bounded_then_refused(vision, data, code):
    client, _ = vision
    r = client.post("/v1beta/models/local:generateContent", json={"contents": [
        {"role": "user", "parts": [{"inlineData": {"mimeType": "audio/wav",
                                                   "data": b64(data)}}]}]})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("contents.0.parts.0.inlineData: ")
    assert ("audio content is not supported" in r.text) == (code == "unsupported_content")
