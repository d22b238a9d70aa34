"""Read and bound one audio clip of a request (OpenAI's ``input_audio``, Gemini's
``inlineData`` with an ``audio/*`` type) before anything of it reaches the engine. No mlx
here: the file is parsed with the standard library's :mod:`wave`.

Every clip, whatever the model, is bounded first, so a bad file is named as such:
base64 text within :data:`MAX_AUDIO_BYTES` decoded bytes (``audio_too_large``, checked
from the text's length before decoding), a RIFF/WAVE file that :mod:`wave` reads (PCM;
``invalid_audio``), holding every frame its header counts, a sample rate within
:data:`MIN_RATE`-:data:`MAX_RATE`, at most :data:`MAX_CHANNELS` channels and at least
:data:`MIN_AUDIO_SECONDS` (``invalid_audio``), at most :data:`MAX_AUDIO_SECONDS` long
(``audio_too_long``). Then:

- a model whose processor takes audio (``capabilities.audio``: Gemma 4, Gemma 3n...) gets
  the clip as an :class:`~kit.engine.types.AudioInput` (the WAV bytes; the engine's
  mlx-vlm resamples them to the model's rate), at most :data:`MAX_AUDIO_CLIPS` per request
  and :data:`MAX_AUDIO_SECONDS` in all (``too_much_audio``);
- any other model answers 400 ``unsupported_content``.

Other formats (mp3, flac, ogg...) are refused with ``unsupported_content`` naming WAV: a
compressed file's duration is not known until it is decoded, which the HTTP process does
not do.
"""

from __future__ import annotations

import hashlib
import io
import wave
from kit.engine.types import AudioInput
from kit.server.errors import APIError

_MIB = 1 << 20

#: Audio bounds (no knobs). 25 MiB is OpenAI's audio upload limit; 10 minutes is far above
#: what a chat turn carries (Gemma 4 reads 30 s per clip).
MAX_AUDIO_BYTES = 25 * _MIB
MAX_AUDIO_SECONDS = 600.0
#: Most clips in one request.
MAX_AUDIO_CLIPS = 16
#: Below this a clip is refused: mlx-vlm's Gemma audio encoder fails on under ~20 ms.
MIN_AUDIO_SECONDS = 0.1
#: The sample rates and channels a clip may have (the decoder mlx-vlm uses, miniaudio,
#: reads no rate above 384 kHz and no more than 254 channels).
MIN_RATE, MAX_RATE = 1_000, 384_000
MAX_CHANNELS = 32


def _seconds(s: float) -> str:
    """``s`` seconds for a message, never rounded onto a limit (600.01 s is not "600 s")."""
    return f"{s:.0f} s" if s == int(s) else f"{s:.3f}".rstrip("0") + " s"


def _bad(where: str, message: str, code: str) -> APIError:
    return APIError(400, f"{where}: {message}", param=where, code=code)


def refuse_audio(where: str) -> APIError:
    """The 400 for audio that passed its bounds, on a model that takes none."""
    return _bad(where, "audio content is not supported by this model", "unsupported_content")


def refuse_format(declared: str | None, where: str) -> APIError:
    """The 400 for a clip that is not WAV, on a model that takes audio."""
    named = f"{declared} audio" if declared else "audio that is not WAV"
    return _bad(where, f"{named} is not read: send WAV (PCM)", "unsupported_content")


def _is_wav(declared: str | None) -> bool:
    return (declared or "").lower().removeprefix("audio/").removeprefix("x-") in (
        "wav", "wave", "vnd.wave")


def read_wav(data: bytes, declared: str | None, where: str) -> AudioInput | None:
    """The clip of ``data`` (already within :data:`MAX_AUDIO_BYTES`): a PCM WAV file,
    whole, at most :data:`MAX_AUDIO_SECONDS` long; None for content that is not WAV and
    was not declared WAV (another format: the caller refuses it).

    Args:
        declared: the format the client named (``wav``, ``mp3``, ``audio/wav``...), or None.
        where: the part's path, for errors.
    Raises:
        APIError: 400 ``invalid_audio`` (declared WAV but not one, not PCM, truncated, a
            rate, channel count or duration out of bounds) or ``audio_too_long``.
    """
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        if _is_wav(declared):
            raise _bad(where, "the audio is not a WAV file (no RIFF/WAVE header)",
                       "invalid_audio")
        return None
    try:
        with wave.open(io.BytesIO(data)) as w:
            frames, rate, channels = w.getnframes(), w.getframerate(), w.getnchannels()
            frame_bytes = w.getsampwidth() * channels
            if rate <= 0 or frame_bytes <= 0:
                raise wave.Error("no frame rate or sample width")
            # what the file holds, before what its header claims is judged
            whole = len(w.readframes(frames)) == frames * frame_bytes
    except Exception:  # wave.Error, EOFError, struct.error...: not a PCM WAV file
        raise _bad(where, "the audio is not a readable PCM WAV file",
                   "invalid_audio") from None
    if not whole:
        raise _bad(where, "the audio is truncated (fewer frames than its header says)",
                   "invalid_audio")
    seconds = frames / rate
    if seconds > MAX_AUDIO_SECONDS:
        raise _bad(where, f"the audio is {_seconds(seconds)} long, over the limit of "
                   f"{_seconds(MAX_AUDIO_SECONDS)}", "audio_too_long")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise _bad(where, f"the audio's sample rate, {rate:,} Hz, is outside "
                   f"{MIN_RATE:,}-{MAX_RATE:,} Hz", "invalid_audio")
    if channels > MAX_CHANNELS:
        raise _bad(where, f"the audio has {channels} channels, more than {MAX_CHANNELS}",
                   "invalid_audio")
    if seconds < MIN_AUDIO_SECONDS:
        raise _bad(where, f"the audio is {_seconds(seconds)} long, shorter than "
                   f"{_seconds(MIN_AUDIO_SECONDS)}", "invalid_audio")
    return AudioInput(data=data, seconds=seconds, sample_rate=rate,
                      digest=hashlib.sha256(data).hexdigest())


class AudioBudget:
    """One request's clips so far, against :data:`MAX_AUDIO_CLIPS` and
    :data:`MAX_AUDIO_SECONDS` in all."""

    def __init__(self) -> None:
        self.count, self.seconds = 0, 0.0

    def add(self, clip: AudioInput, where: str) -> AudioInput:
        """``clip``, counted.

        Raises:
            APIError: 400 ``too_much_audio`` past either bound.
        """
        self.count += 1
        self.seconds += clip.seconds
        if self.count > MAX_AUDIO_CLIPS:
            raise _bad(where, f"more than {MAX_AUDIO_CLIPS} audio clips in one request",
                       "too_much_audio")
        if self.seconds > MAX_AUDIO_SECONDS:
            raise _bad(where, f"the request's audio is {_seconds(self.seconds)} long in all, "
                       f"over the limit of {_seconds(MAX_AUDIO_SECONDS)}", "too_much_audio")
        return clip


__all__ = ["MAX_AUDIO_BYTES", "MAX_AUDIO_CLIPS", "MAX_AUDIO_SECONDS", "AudioBudget",
           "read_wav", "refuse_audio", "refuse_format"]
