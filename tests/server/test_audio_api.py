"""Audio through the HTTP side (issue 28), model-free: the real app over a stand-in engine
that reports a model taking images and audio, recording what reaches it:
``{"type": "audio"}`` parts in the client's order among texts and images, and
``ChatRequest.audio`` (the WAV bytes, duration, rate, digest), on chat completions,
Responses and Gemini (Messages has no audio block), streamed and not. A model that takes
images only keeps the 400 after the bounds (tests/server/test_images_refused_api.py); a
real omni model: tests/server/test_audio_model.py."""

from __future__ import annotations

import base64

import pytest

from tests.server.images import IMG, PNG, chat_body, error, image_url, sha, vision_client, wav

AUDIO = {"type": "audio"}  # an audio part as the engine gets it
CLIP = wav(frames=16000, rate=8000)  # 2 s


@pytest.fixture
def omni():
    client, engine = vision_client(audio=True)
    with client:
        yield client, engine


def audio_part(data: bytes = CLIP, fmt: str = "wav", kind: str = "input_audio") -> dict:
    return {"type": kind, "input_audio": {"data": base64.b64encode(data).decode(),
                                          "format": fmt}}


@pytest.mark.parametrize("stream", [False, True])
def test_chat_audio_parts_reach_the_engine_in_order_among_images(omni, stream):
    client, engine = omni
    short = wav(frames=800, rate=8000)
    r = client.post("/v1/chat/completions", json=chat_body(
        {"type": "text", "text": "a"}, audio_part(), image_url(PNG),
        {"type": "text", "text": "b"}, audio_part(short), stream=stream))
    assert r.status_code == 200, r.text
    req = engine.seen[-1]
    assert req.messages[0]["content"] == [{"type": "text", "text": "a"}, AUDIO, IMG,
                                          {"type": "text", "text": "b"}, AUDIO]
    first, second = req.audio
    assert (first.data, first.seconds, first.sample_rate, first.digest) == (
        CLIP, 2.0, 8000, sha(CLIP))
    assert second.data == short and second.seconds == 0.1
    assert [i.data for i in req.images] == [PNG]


def test_responses_input_audio_reaches_the_engine(omni):
    client, engine = omni
    r = client.post("/v1/responses", json={"model": "local", "max_output_tokens": 8, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hear"},
                                     audio_part(kind="input_audio")]}]})
    assert r.status_code == 200, r.text
    assert engine.seen[-1].messages[-1]["content"] == [{"type": "text", "text": "hear"}, AUDIO]
    assert engine.seen[-1].audio[0].data == CLIP


def test_gemini_inline_audio_reaches_the_engine_and_count_tokens_carries_it(omni):
    client, engine = omni
    contents = [{"role": "user", "parts": [
        {"text": "hear"}, {"inlineData": {"mimeType": "audio/wav",
                                          "data": base64.b64encode(CLIP).decode()}}]}]
    r = client.post("/v1beta/models/local:generateContent", json={"contents": contents})
    assert r.status_code == 200, r.text
    assert engine.seen[-1].messages[-1]["content"] == [{"type": "text", "text": "hear"}, AUDIO]
    assert engine.seen[-1].audio[0].digest == sha(CLIP)
    r = client.post("/v1beta/models/local:countTokens", json={"contents": contents})
    assert r.status_code == 200 and engine.counted[-1].audio[0].data == CLIP


def test_an_audio_clip_in_a_system_message_is_refused_naming_it(omni):
    client, _ = omni
    r = client.post("/v1/responses", json={"model": "local", "input": [
        {"role": "system", "content": [audio_part()]},
        {"role": "user", "content": "hi"}]})
    e = error(r)
    assert e["param"] == "input.0.content.0" and "cannot carry audio" in e["message"]


@pytest.mark.parametrize("data,fmt,code,says", [
    (b"ID3" + b"\x00" * 64, "mp3", "unsupported_content", "mp3 audio is not read: send WAV"),
    (wav(frames=601, rate=1), "wav", "audio_too_long", "601 s long"),
    (CLIP[:-300], "wav", "invalid_audio", "truncated"),
])
def test_a_model_that_takes_audio_reads_whole_wav_only(omni, data, fmt, code, says):
    client, engine = omni
    n = len(engine.seen)
    e = error(client.post("/v1/chat/completions", json=chat_body(audio_part(data, fmt))))
    assert e["code"] == code and says in e["message"] and e["param"] == "messages.0.content.0"
    assert len(engine.seen) == n  # nothing reached the engine


def test_seventeen_clips_are_one_too_many(omni):
    client, _ = omni
    one = wav(frames=800, rate=8000)  # 0.1 s, the shortest taken
    e = error(client.post("/v1/chat/completions", json=chat_body(
        *[audio_part(one) for _ in range(17)])))
    assert e["code"] == "too_much_audio" and e["param"] == "messages.0.content.16"


def test_a_format_that_is_not_a_string_is_refused_naming_it(omni):
    client, _ = omni
    part = audio_part()
    part["input_audio"]["format"] = 3
    e = error(client.post("/v1/chat/completions", json=chat_body(part)))
    assert e["param"] == "messages.0.content.0.input_audio.format"


def test_gemini_audio_in_a_model_turn_is_refused_naming_audio(omni):
    client, _ = omni
    blob = {"inlineData": {"mimeType": "audio/wav", "data": base64.b64encode(CLIP).decode()}}
    r = client.post("/v1beta/models/local:generateContent", json={"contents": [
        {"role": "user", "parts": [{"text": "hi"}]}, {"role": "model", "parts": [blob]},
        {"role": "user", "parts": [{"text": "again"}]}]})
    e = r.json()["error"]
    assert r.status_code == 400 and "cannot carry images or audio" in e["message"]
