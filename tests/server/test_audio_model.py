"""Audio input end to end on an omni model: a tiny random-weight Gemma 4 (text, image and
audio towers) built here with mlx-vlm's own classes (bench/random_omni.py; no real omni
weights can be had offline), served by one server as ``local``.

Its text is noise, so the checks are the ones that hold whatever the weights: the answer
to a clip is exactly what mlx-vlm itself generates for the same prompt and WAV bytes
(bytes -> mlx-vlm's audio loader and Gemma 4 feature extractor -> audio tokens -> model ->
text); the clip's tokens (one per 40 ms) are counted in the usage and by countTokens;
chat completions, Responses and Gemini, streamed or not, give the same answer for the same
clip and words; a second turn about the same clip comes from the prompt cache and one
about another clip never does; what is not WAV is refused naming the part."""

from __future__ import annotations

import base64
import io

import httpx
import pytest

from bench.random_omni import audio_tokens, wav_bytes
from tests.helpers import start_server, stop
from tests.server.test_adapters_model import starter_folder

pytestmark = pytest.mark.model

QUESTION = "What do you hear?"
CLIP = wav_bytes(3.0, 16000)  # 75 audio tokens
AUDIO_TOKENS_3S = audio_tokens(3.0)


@pytest.fixture(scope="module")
def omni(hf_home, tmp_path_factory):
    from bench.random_omni import build

    return build(tmp_path_factory.mktemp("omni") / "tiny-gemma4", seed=0,
                 tokenizer=starter_folder(hf_home))


@pytest.fixture(scope="module")
def omni_server(hf_home, omni, tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("home-omni"), hf_home, "--model", str(omni),
                     "--temperature", "0")
    yield s
    stop(s)


def audio_part(clip: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(clip).decode(), "format": fmt}}


def chat(server, clip: bytes | None, text: str = QUESTION, history=(), max_tokens=8,
         fmt: str = "wav") -> httpx.Response:
    content = [{"type": "text", "text": text}] + ([audio_part(clip, fmt)] if clip else [])
    return httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": "local", "max_tokens": max_tokens, "temperature": 0,
        "messages": [*history, {"role": "user", "content": content}]})


def answer(server, clip: bytes | None, **kw) -> dict:
    r = chat(server, clip, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def mlx_vlm_answer(folder, clip: bytes | list[bytes], max_tokens: int = 8,
                   parts: list[dict] | None = None) -> str:
    """What mlx-vlm generates itself, greedy, for one user message [text, audio] (or
    ``parts``, whose ``{"type": "audio"}`` items are the clips of ``clip``, in order)."""
    import mlx.core as mx
    from mlx_vlm import load, prepare_inputs, stream_generate

    clips = clip if isinstance(clip, list) else [clip]
    model, processor = load(str(folder))
    parts = parts or [{"type": "text", "text": QUESTION}, {"type": "audio"}]
    # the tokenizer's template, as the server renders it: the processor's own
    # apply_chat_template moves the audio after the text
    prompt = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False)
    inputs = prepare_inputs(processor, audio=[io.BytesIO(c) for c in clips], prompts=prompt)
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    text = "".join(r.text for r in stream_generate(
        model, processor, prompt, input_ids=inputs["input_ids"],
        mask=inputs["attention_mask"], max_tokens=max_tokens, temperature=0.0, **extra))
    mx.clear_cache()
    return text


def test_the_model_says_it_takes_audio_and_images(omni_server):
    local = httpx.get(omni_server.v1 + "/models").json()["data"][0]
    assert local["id"] == "local"
    assert local["capabilities"]["audio"] is True and local["capabilities"]["vision"] is True


def test_an_audio_answer_is_mlx_vlms_own_and_counts_the_audio_tokens(omni_server, omni):
    body = answer(omni_server, CLIP)
    text_only = answer(omni_server, None)
    # <|audio>, one <|audio|> per 40 ms, <audio|>
    assert body["usage"]["prompt_tokens"] == \
        text_only["usage"]["prompt_tokens"] + 2 + AUDIO_TOKENS_3S
    assert body["choices"][0]["message"]["content"] == mlx_vlm_answer(omni, CLIP)
    # another clip, the same words: the answer changes (the model hears the clip)
    other = answer(omni_server, wav_bytes(3.0, 16000, pitch_hz=330.0))
    assert other["choices"][0]["message"]["content"] != body["choices"][0]["message"]["content"]


def test_the_usage_counts_the_clips_tokens_apart_from_the_text(omni_server):
    """Chat completions' ``prompt_tokens_details.audio_tokens`` and Gemini's AUDIO entry of
    ``promptTokensDetails`` are the clip's audio tokens (its begin and end markers count
    as text); without a clip, 0 and TEXT alone."""
    from google.genai import types

    from tests.server.test_gemini import make_client

    assert answer(omni_server, CLIP)["usage"]["prompt_tokens_details"]["audio_tokens"] == \
        AUDIO_TOKENS_3S
    assert answer(omni_server, None)["usage"]["prompt_tokens_details"]["audio_tokens"] == 0
    gem, config = make_client(omni_server.root), types.GenerateContentConfig(max_output_tokens=4)
    for parts, audio in (([types.Part(text=QUESTION),
                           types.Part.from_bytes(data=CLIP, mime_type="audio/wav")],
                          AUDIO_TOKENS_3S), ([types.Part(text=QUESTION)], 0)):
        usage = gem.models.generate_content(model="local", config=config, contents=[
            types.Content(role="user", parts=parts)]).usage_metadata
        details = {d.modality.value: d.token_count for d in usage.prompt_tokens_details}
        assert details == {"TEXT": usage.prompt_token_count - audio,
                           **({"AUDIO": audio} if audio else {})}, details


def test_a_clip_at_another_rate_in_stereo_is_resampled_to_the_same_length(omni_server):
    stereo = wav_bytes(3.0, 44100, channels=2)
    mono = answer(omni_server, CLIP)["usage"]["prompt_tokens"]
    assert answer(omni_server, stereo)["usage"]["prompt_tokens"] == mono


def each_protocol(server, clip: bytes) -> dict[str, str]:
    """The answer to one user message [text, clip] on chat completions, Responses and
    Gemini through their official SDKs, streamed and not (8 tokens, greedy)."""
    from google.genai import types

    from tests.helpers import openai_for
    from tests.server.test_gemini import make_client

    oa = openai_for(server)
    chat_msgs = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                              audio_part(clip)]}]
    resp_input = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION},
                                               audio_part(clip)]}]
    contents = [types.Content(role="user", parts=[
        types.Part(text=QUESTION), types.Part.from_bytes(data=clip, mime_type="audio/wav")])]
    config = types.GenerateContentConfig(max_output_tokens=8)
    gem = make_client(server.root)
    out = {
        "chat stream": "".join(c.choices[0].delta.content or "" for c in
                               oa.chat.completions.create(
                                   model="local", messages=chat_msgs, max_tokens=8,
                                   stream=True) if c.choices),
        "responses": oa.responses.create(model="local", input=resp_input,
                                         max_output_tokens=8).output_text,
        "gemini": gem.models.generate_content(model="local", contents=contents,
                                              config=config).text,
        "gemini stream": "".join(c.text or "" for c in gem.models.generate_content_stream(
            model="local", contents=contents, config=config)),
    }
    out["responses stream"] = "".join(
        e.delta for e in oa.responses.create(model="local", input=resp_input, stream=True,
                                             max_output_tokens=8)
        if e.type == "response.output_text.delta")
    counted = gem.models.count_tokens(model="local", contents=contents).total_tokens
    return out, counted


def test_every_protocol_streamed_or_not_gives_the_same_answer_to_the_same_clip(omni_server):
    clip = wav_bytes(2.0, 16000, pitch_hz=330.0)
    answers, counted = each_protocol(omni_server, clip)
    expected = answer(omni_server, clip)
    text = expected["choices"][0]["message"]["content"]
    assert text and answers == {k: text for k in answers}
    assert counted == expected["usage"]["prompt_tokens"]


def test_a_second_turn_about_the_same_clip_comes_from_the_prompt_cache(omni_server):
    clip, other = wav_bytes(3.0, 16000, pitch_hz=550.0), wav_bytes(3.0, 16000, pitch_hz=660.0)
    first = answer(omni_server, clip)
    history = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                            audio_part(clip)]},
               {"role": "assistant", "content": first["choices"][0]["message"]["content"]}]
    second = answer(omni_server, None, text="And how loud?", history=history)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > first["usage"]["prompt_tokens"] - 5  # the clip and the first answer
    # the same words about another clip: its audio tokens are the same ids, and still
    # nothing of the first conversation's KV may serve it
    history[0]["content"][1] = audio_part(other)
    third = answer(omni_server, None, text="And how loud?", history=history)
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize("data,fmt,code,says", [
    (b"ID3" + b"\x00" * 64, "mp3", "unsupported_content", "mp3 audio is not read: send WAV"),
    (CLIP[:-300], "wav", "invalid_audio", "truncated"),
])
def test_what_is_not_a_whole_wav_is_refused_naming_the_part(omni_server, data, fmt, code,
                                                            says):
    r = chat(omni_server, data, fmt=fmt)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == code and says in err["message"]
    assert err["param"] == "messages.0.content.1"


def test_a_prompt_cache_prefix_never_ends_between_two_clips(omni_server, omni):
    # Two clips, then the same two with other words between them: the cached prefix ends
    # inside the words, so the second clip would be prefilled from the cache's turn.
    # mlx-vlm 0.7.10 alone would give it the first clip's features; it must run cold.
    one, two = wav_bytes(1.0, 16000, pitch_hz=250.0), wav_bytes(1.0, 16000, pitch_hz=900.0)

    def ask(middle: str) -> dict:
        r = httpx.post(omni_server.v1 + "/chat/completions", timeout=120, json={
            "model": "local", "max_tokens": 8, "temperature": 0, "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "First:"}, audio_part(one),
                    {"type": "text", "text": middle}, audio_part(two)]}]})
        assert r.status_code == 200, r.text
        return r.json()

    ask("Then the second one:")
    again = ask("And now this:")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    parts = [{"type": "text", "text": "First:"}, {"type": "audio"},
             {"type": "text", "text": "And now this:"}, {"type": "audio"}]
    assert again["choices"][0]["message"]["content"] == \
        mlx_vlm_answer(omni, [one, two], parts=parts)
