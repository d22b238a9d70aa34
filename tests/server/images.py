"""Tiny images, audio and bombs for the image tests (made here with Pillow and the stdlib,
no files), request parts in each protocol's shape, and the stand-in engine that reports
vision."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import struct
import wave
import zlib

from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from kit.server.content.media import MediaLimits
from tests.server.test_adapters_api import RecordingEngine
from tests.server.test_metrics import make_app


def image(fmt: str = "PNG", size: tuple[int, int] = (8, 8),
          color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """An image file of ``size`` in one colour (PNG, JPEG, GIF, WEBP, BMP...)."""
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def noise_png(size: int = 64) -> bytes:
    """A PNG of random pixels (it does not compress: cut, it is truncated in its pixels)."""
    buf = io.BytesIO()
    Image.frombytes("RGB", (size, size), os.urandom(size * size * 3)).save(buf, format="PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels, with almost no pixel data:
    a decompression bomb's shape (a real one would inflate to the size it claims)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + \
            struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def wav(frames: int = 800, rate: int = 8000, channels: int = 1) -> bytes:
    """An 8-bit PCM WAV file of ``frames`` frames at ``rate`` Hz (silence)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(1)
        w.setframerate(rate)
        w.writeframes(b"\x80" * frames * channels)
    return buf.getvalue()


class VisionEngine(RecordingEngine):
    """The recording stand-in engine, as a model that takes images (and audio, with
    ``audio``); it keeps the requests it counts tokens of too."""

    def __init__(self, audio: bool = False) -> None:
        super().__init__()
        self.counted = []
        self.audio = audio

    def capabilities(self) -> dict:
        return {**super().capabilities(), "vision": True, "audio": self.audio}

    async def count_tokens_async(self, request) -> int:
        self.counted.append(request)
        return 5


@pytest.fixture
def vision():
    """``(client, engine)``: :func:`vision_client` with the default bounds, for a test
    (import it into the test module to use it)."""
    client, engine = vision_client()
    with client:
        yield client, engine


def openai_sdk(client: TestClient) -> Any:
    """The official OpenAI SDK on ``client`` (the in-process app), no retries."""
    import openai

    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused",
                         http_client=client, max_retries=0)


def anthropic_sdk(client: TestClient) -> Any:
    """The official Anthropic SDK on ``client`` (the in-process app), no retries."""
    import anthropic

    return anthropic.Anthropic(base_url="http://testserver", api_key="unused",
                               http_client=client, max_retries=0)


def vision_client(audio: bool = False, **limits) -> tuple[TestClient, VisionEngine]:
    """A client of the app on a :class:`VisionEngine` (one that takes audio too, with
    ``audio``) with ``limits`` (MediaLimits fields; use it as a context manager, or not:
    the stand-in needs no lifespan)."""
    engine = VisionEngine(audio)
    return TestClient(make_app(engine, media_limits=MediaLimits(**limits))), engine


PNG, JPEG = image("PNG"), image("JPEG", (16, 8), (10, 200, 10))
GIF, WEBP = image("GIF", (4, 4)), image("WEBP", (8, 4))
IMG = {"type": "image"}  # an image part as the engine gets it


def chat_body(*parts: dict, stream: bool = False) -> dict:
    """A chat completions body of one user message of ``parts``."""
    return {"model": "local", "stream": stream, "max_tokens": 8,
            "messages": [{"role": "user", "content": list(parts)}]}


def image_url(data: bytes, media_type: str = "image/png") -> dict:
    """A chat completions ``image_url`` part of ``data`` as a data URL."""
    return {"type": "image_url", "image_url": {"url": data_url(data, media_type),
                                               "detail": "auto"}}


def block(data: bytes, media_type: str = "image/png") -> dict:
    """A Messages ``image`` block of ``data`` (base64 source)."""
    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": b64(data)}}


def error(r) -> dict:
    """The OpenAI-shaped error of a 400 response."""
    assert r.status_code == 400, r.text[:500]
    return r.json()["error"]
