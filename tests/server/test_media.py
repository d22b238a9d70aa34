"""kit/server/content/media.py and audio.py alone: base64 bounded before it is decoded,
images read by their content and bounded, audio bounded, then read by a model that takes
audio and refused by any other; and translate's multimodal content (merge, with_media).
The same through every protocol: tests/server/test_images_api.py."""

from __future__ import annotations

import base64

import pytest
from PIL import Image

from kit.engine.types import AudioInput, ImageInput
from kit.server.content.audio import MAX_AUDIO_BYTES, MAX_AUDIO_CLIPS
from kit.server.content.media import (
    MediaLimits,
    MediaReader,
    decode_base64,
    read_image,
    size_text,
)
from kit.server.errors import APIError
from kit.server.translate import merge, with_media
from tests.server.images import b64, data_url, image, sha, wav

PNG = image("PNG")


def code_of(call, *args) -> tuple[str, str]:
    with pytest.raises(APIError) as e:
        call(*args)
    assert e.value.status == 400 and e.value.message.startswith(e.value.param + ": ")
    return e.value.code, e.value.message


@pytest.mark.parametrize("text", [
    b64(PNG),
    "\n".join(b64(PNG)[i:i + 76] for i in range(0, len(b64(PNG)), 76)),  # MIME line breaks
    base64.urlsafe_b64encode(PNG).decode().rstrip("="),  # URL-safe, no padding (Google's)
])
def test_base64_in_its_common_spellings_decodes_to_the_same_bytes(text):
    assert decode_base64(text, "p", 1000, "image") == PNG


@pytest.mark.parametrize("text", ["", None, 5, "a!b@", "é" * 8, "abcde"])
def test_what_is_not_base64_is_invalid(text):
    assert code_of(decode_base64, text, "p", 1000, "image")[0] == "invalid_image"


def test_a_data_url_where_the_base64_alone_goes_is_named_as_such():
    """Regression: a data: URL in input_audio.data (which takes the base64 alone) was
    refused as "not valid base64", which it is, but not why."""
    code, message = code_of(decode_base64, data_url(wav(), "audio/wav"), "input_audio.data",
                            MAX_AUDIO_BYTES, "audio")
    assert code == "invalid_audio"
    assert message == ("input_audio.data: the audio data is not valid base64: this field "
                       "takes the base64 alone, not a data: URL (send what follows the comma)")


def test_the_byte_bound_is_exact_and_checked_on_the_text_first():
    data = b"x" * 30
    assert decode_base64(b64(data), "p", 30, "image") == data
    code, message = code_of(decode_base64, b64(data + b"y"), "p", 30, "image", "--max-x")
    assert code == "image_too_large" and "--max-x" in message
    # text past the bound is refused for its length alone, whatever it holds
    assert code_of(decode_base64, "!" * 1000, "p", 30, "audio")[0] == "audio_too_large"


def test_audio_past_25_mib_is_refused_before_it_is_decoded():
    text = "A" * (4 * (MAX_AUDIO_BYTES // 3) + 8)
    code, message = code_of(MediaReader(vision=True).audio_base64, text, "wav", "a.0")
    assert code == "audio_too_large" and "25 MiB" in message


@pytest.mark.parametrize("fmt,media_type", [("PNG", "image/png"), ("JPEG", "image/jpeg"),
                                            ("GIF", "image/gif"), ("WEBP", "image/webp")])
def test_each_format_is_read_with_its_size_type_and_digest(fmt, media_type):
    data = image(fmt, (5, 3))
    got = read_image(data, "p", MediaLimits())
    assert got == ImageInput(data, media_type, 5, 3, sha(data))


def test_an_animated_gif_is_read_by_its_first_frame():
    import io

    frames = [Image.new("RGB", (6, 6), c) for c in ((255, 0, 0), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    got = read_image(buf.getvalue(), "p", MediaLimits())
    assert (got.media_type, got.width, got.height) == ("image/gif", 6, 6)


def test_the_pixel_bound_is_inclusive():
    assert read_image(PNG, "p", MediaLimits(max_image_pixels=64)).width == 8
    code, message = code_of(read_image, PNG, "p", MediaLimits(max_image_pixels=63))
    assert code == "image_too_large" and "8x8 pixels (64)" in message


def test_a_data_url_is_read_whatever_the_case_of_its_header():
    reader = MediaReader(vision=True)
    url = "DATA:image/PNG;charset=x;BASE64," + b64(PNG)
    assert reader.image_url(url, "p").data == PNG
    assert reader.image_url(data_url(PNG, "image/jpeg"), "p").media_type == "image/png"
    assert reader.count == 2


def test_the_count_bound_names_the_first_image_past_it():
    reader = MediaReader(MediaLimits(max_images=1), vision=True)
    reader.image_base64(b64(PNG), "a")
    code, message = code_of(reader.image_base64, b64(PNG), "b")
    assert code == "too_many_images" and message.startswith("b: more than 1 image in one request")


@pytest.mark.parametrize("data,declared,code", [
    (wav(), "wav", "unsupported_content"),
    (wav(), "audio/x-wav", "unsupported_content"),
    (wav(), "mp3", "unsupported_content"),  # the content is WAV: parsed all the same
    (wav(frames=601, rate=1), None, "audio_too_long"),
    (wav(frames=600_000, rate=1000), None, "unsupported_content"),  # 600 s: within it
    (wav()[:60], "wav", "invalid_audio"),
    (b"RIFF\x00\x00\x00\x00WAVEjunk", None, "invalid_audio"),
    (b"\xff\xfb\x90\x00" * 10, "mp3", "unsupported_content"),
    (b"\xff\xfb\x90\x00" * 10, "wav", "invalid_audio"),
])
def test_audio_is_bounded_then_refused_by_a_model_that_takes_none(data, declared, code):
    reader = MediaReader(vision=True)
    assert code_of(reader.audio_base64, b64(data), declared, "a.1")[0] == code


@pytest.mark.parametrize("data,declared,code,says", [
    (wav(frames=601, rate=1), None, "audio_too_long", "601 s long"),
    (wav()[:60], "wav", "invalid_audio", "truncated"),
    (b"\xff\xfb\x90\x00" * 10, "mp3", "unsupported_content", "mp3 audio is not read: send WAV"),
    (b"\xff\xfb\x90\x00" * 10, None, "unsupported_content", "not WAV is not read"),
])
def test_a_model_that_takes_audio_still_bounds_it_and_reads_only_wav(data, declared, code, says):
    reader = MediaReader(vision=True, audio=True)
    got, message = code_of(reader.audio_base64, b64(data), declared, "a.1")
    assert got == code and says in message


@pytest.mark.parametrize("data,says", [
    (wav(frames=100, rate=8000), "0.013 s long, shorter than 0.1 s"),  # mlx-vlm failed: a 500
    (wav(frames=400_000, rate=384_001), "sample rate, 384,001 Hz, is outside 1,000-384,000"),
    (wav(frames=8000, rate=999), "sample rate, 999 Hz"),
    (wav(frames=800, rate=8000, channels=33), "33 channels, more than 32"),
    (wav(frames=600_010, rate=1000), "600.01 s long, over the limit of 600 s"),
])
def test_clips_the_model_cannot_read_are_refused_before_it_sees_them(data, says):
    # regressions from a new user's trial: each was a 500 from mlx-vlm, or a rounded message
    reader = MediaReader(vision=True, audio=True)
    code, message = code_of(reader.audio_base64, b64(data), "wav", "a.0")
    assert code in ("invalid_audio", "audio_too_long") and says in message


def test_a_header_that_claims_more_than_the_file_holds_is_truncated_not_too_long():
    data = bytearray(wav(frames=800, rate=8000))
    data[40:44] = (0xFFFFFFF0).to_bytes(4, "little")  # the data chunk's size
    code, message = code_of(MediaReader(vision=True, audio=True).audio_base64,
                            b64(bytes(data)), "wav", "a.0")
    assert code == "invalid_audio" and "truncated" in message


def test_a_model_that_takes_audio_gets_the_clip_with_its_duration_rate_and_digest():
    data = wav(frames=24000, rate=8000)
    clip = MediaReader(vision=True, audio=True).audio_base64(b64(data), "wav", "a.0")
    assert (clip.data, clip.seconds, clip.sample_rate, clip.digest) == (data, 3.0, 8000,
                                                                        sha(data))


def test_the_audio_bounds_count_clips_and_seconds_over_the_whole_request():
    reader = MediaReader(vision=True, audio=True)
    for i in range(MAX_AUDIO_CLIPS):
        reader.audio_base64(b64(wav(frames=100, rate=1000)), None, f"a.{i}")
    code, message = code_of(reader.audio_base64, b64(wav(frames=100, rate=1000)), None, "b")
    assert code == "too_much_audio" and message.startswith("b: more than 16 audio clips")
    reader = MediaReader(vision=True, audio=True)
    reader.audio_base64(b64(wav(frames=400_000, rate=1000)), None, "a")
    code, message = code_of(reader.audio_base64, b64(wav(frames=201_000, rate=1000)), None, "b")
    assert code == "too_much_audio" and "601 s long in all" in message


def test_audio_is_never_taken_by_a_reader_without_vision():
    # a text-only model's reader: the translation refuses media parts before reading
    assert MediaReader(vision=False, audio=True).audio is False


def test_size_text():
    assert [size_text(n) for n in (12, 2048, 20 * 2**20, 3 * 2**19)] == [
        "12 bytes", "2 KiB", "20 MiB", "1.5 MiB"]
    # one byte over a limit never prints as the limit itself (a new-user trial saw
    # "about 1 KiB, over the limit of 1 KiB")
    assert [size_text(n) for n in (1025, 1244, 20 * 2**20 + 1)] == [
        "1,025 bytes", "1,244 bytes", "20 MiB (20,971,521 bytes)"]


def test_merge_keeps_text_a_string_and_orders_images_among_texts():
    img = ImageInput(PNG, "image/png", 8, 8, sha(PNG))
    assert merge(["a", "", "b"]) == "ab"
    assert merge(["a", "b", img, "", img, "c"]) == [
        {"type": "text", "text": "ab"}, img, img, {"type": "text", "text": "c"}]
    got = with_media([{"role": "user", "content": merge([img, "x"])},
                      {"role": "assistant", "content": "y"}])
    assert got["messages"][0]["content"] == [{"type": "image"}, {"type": "text", "text": "x"}]
    assert got["images"] == (img,) and got["audio"] == ()


def test_with_media_orders_images_and_audio_apart_in_message_order():
    img = ImageInput(PNG, "image/png", 8, 8, sha(PNG))
    data = wav()
    clip = AudioInput(data, 0.1, 8000, sha(data))
    got = with_media([{"role": "user", "content": merge(["hear", clip, img])},
                      {"role": "tool", "content": merge([img, clip, "z"])}])
    assert got["messages"][0]["content"] == [{"type": "text", "text": "hear"},
                                             {"type": "audio"}, {"type": "image"}]
    assert got["messages"][1]["content"] == [{"type": "image"}, {"type": "audio"},
                                             {"type": "text", "text": "z"}]
    assert got["images"] == (img, img) and got["audio"] == (clip, clip)


@pytest.mark.parametrize("audio", [False, True])
def test_a_gemini_blob_of_another_type_is_refused_naming_what_the_model_reads(audio):
    """Regression: on a model that takes audio, the refusal of an inlineData type it does
    not read listed the image types alone."""
    from kit.server.gemini_translate import _inline

    code, message = code_of(_inline, {"mimeType": "video/mp4", "data": "AAAA"},
                            "contents.0.parts.0.inlineData",
                            MediaReader(vision=True, audio=audio))
    assert code == "unsupported_content"
    assert message == ("contents.0.parts.0.inlineData: 'video/mp4' content is not supported "
                       "by this model (images are: image/png, image/jpeg, image/webp, "
                       "image/gif" + ("; audio is: audio/wav (PCM)" if audio else "") + ")")
