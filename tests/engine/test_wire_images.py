"""A request's images and audio clips on the engine pipe (kit/engine/proc/wire_records.py):
their bytes cross as base64 in the JSON records (no pickle), byte for byte, and the
receiver bounds their count, size, type (duration and rate) and digest."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace

import pytest

from kit.engine.proc import wire
from kit.engine.proc.wire_records import AUDIO_BYTES, IMAGE_BYTES, MAX_AUDIO, MAX_IMAGES
from kit.engine.types import AudioInput, ChatRequest, ImageInput


def _image(data: bytes, media_type: str = "image/png", size: tuple[int, int] = (8, 8)
           ) -> ImageInput:
    return ImageInput(data, media_type, *size, hashlib.sha256(data).hexdigest())


# every byte value, and bytes that are no UTF-8
FIRST = _image(bytes(range(256)) * 3)
SECOND = _image(b"\xff\xd8\xff" + os.urandom(5000), "image/jpeg", (640, 480))
CLIP = AudioInput(b"RIFF" + bytes(range(256)), 2.5, 16000,
                  hashlib.sha256(b"RIFF" + bytes(range(256))).hexdigest())
REQUEST = ChatRequest(
    [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"},
                                  {"type": "audio"}]},
     {"role": "tool", "tool_call_id": "c", "content": [{"type": "image"}]}],
    images=(FIRST, SECOND), audio=(CLIP,), request_id="req-img")


@pytest.mark.parametrize("tag", ["gen", "count"])
def test_a_request_with_two_images_round_trips_byte_exactly(tag):
    frame = wire.encode((tag, 7, REQUEST))
    got = wire.decode(frame)
    assert got[:2] == (tag, 7)
    assert got[2] == REQUEST
    assert [i.data for i in got[2].images] == [FIRST.data, SECOND.data]
    assert isinstance(got[2].images, tuple) and isinstance(got[2].images[0], ImageInput)
    assert got[2].audio == (CLIP,) and isinstance(got[2].audio[0], AudioInput)


def test_the_bytes_cross_as_base64_text_not_a_pickle():
    frame = wire.encode(("gen", 1, REQUEST))
    assert b'"data":"' in frame and b"\x80\x04" not in frame[:64]


@pytest.mark.parametrize("bad", [
    dict(images=(FIRST,) * (MAX_IMAGES + 1)),
    dict(images=(_image(b"\x00" * (IMAGE_BYTES + 1)),)),
    dict(images=(replace(FIRST, media_type="image/bmp"),)),
    dict(images=(replace(FIRST, width=0),)),
    dict(images=(replace(FIRST, digest="abc"),)),
    dict(audio=(CLIP,) * (MAX_AUDIO + 1)),
    dict(audio=(replace(CLIP, data=b"\x00" * (AUDIO_BYTES + 1)),)),
    dict(audio=(replace(CLIP, seconds=-1.0),)),
    dict(audio=(replace(CLIP, sample_rate=0),)),
    dict(audio=(replace(CLIP, digest="abc"),)),
])
def test_media_past_the_wire_bounds_are_refused_by_the_receiver(bad):
    frame = wire.encode(("gen", 3, replace(REQUEST, **bad)))
    with pytest.raises(wire.WireError) as e:
        wire.decode(frame)
    assert e.value.ident == 3 and e.value.stream == "ev"
