"""Decode and bound one image or audio input of a request, before anything of it reaches
the engine. No mlx here: the HTTP process never imports it; images are read with Pillow.

What a request may carry (every refusal is a 400 whose ``param`` is the part's path,
``messages.0.content.1``, and whose message starts with it):

- images inline only: a data URL (``data:image/png;base64,...``) or base64 with a media
  type (Anthropic's ``source.type=base64``, Gemini's ``inlineData``). Remote URLs
  (``http(s)://``, Anthropic's ``source.type=url``) are refused: this server makes no
  network request on a client's behalf. Files are refused too: the server's disk is not
  read (``file://``, a path) and no file store exists (Files API ids).
- at most :attr:`MediaLimits.max_images` images per request (``too_many_images``), each at
  most :attr:`MediaLimits.max_image_bytes` decoded bytes (``image_too_large``; the base64
  text's length is checked before it is decoded) and :attr:`MediaLimits.max_image_pixels`
  pixels (``image_too_large``; read from the file's header before any pixel is decoded,
  so a decompression bomb costs nothing).
- PNG, JPEG, WebP or GIF, told by the file's content; the declared media type is not
  trusted and a disagreeing one is not an error: the image goes on with its real type. A
  file that is none of them, or that does not decode to its end (truncated, corrupt), is
  ``invalid_image``.
- audio: WAV (PCM), bounded by :mod:`kit.server.content.audio`, then read by a model that
  takes audio (``capabilities.audio``) and refused by any other (``unsupported_content``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image
# the plugins of the formats read; registered by their import (Image.open(formats=...)
# looks only among registered ones, and Pillow registers WebP and MPO lazily)
from PIL import GifImagePlugin, JpegImagePlugin, MpoImagePlugin, PngImagePlugin  # noqa: F401
from PIL import WebPImagePlugin  # noqa: F401

from kit.engine.types import AudioInput, ImageInput
from kit.server.content.audio import (
    MAX_AUDIO_BYTES,
    AudioBudget,
    read_wav,
    refuse_audio,
    refuse_format,
)
from kit.server.content.image_files import read_image_file
from kit.server.errors import APIError

_MIB = 1 << 20

DEFAULT_MAX_IMAGE_BYTES = 20 * _MIB  # OpenAI's and Gemini's inline limit per request
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000  # a 7071x7071 image; vision encoders resize far below
DEFAULT_MAX_IMAGES = 16

#: Pillow's format name -> the media type the engine gets. MPO is a JPEG with extra
#: pictures (phone cameras); the first is the image.
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "MPO": "image/jpeg",
           "WEBP": "image/webp", "GIF": "image/gif"}

#: The formats Pillow is asked to recognise (a JPEG with extra pictures opens as MPO).
_OPEN = ("PNG", "JPEG", "WEBP", "GIF")

#: Images decoded at once, over all requests: a decoded image holds up to 4 bytes a pixel
#: (200 MB at the default --max-image-pixels) until it is checked and dropped, so
#: concurrent requests' decodes wait here rather than add up.
_DECODING = threading.BoundedSemaphore(2)

#: The data URL of the error messages' examples.
_EXAMPLE = "data:image/png;base64,..."

# Our own pixel bound (checked from the header, before decoding) replaces Pillow's
# DecompressionBombWarning, which would only be noise in the log, or an exception under
# `python -W error`. Its DecompressionBombError (past twice Pillow's own limit) is caught.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


@dataclass(frozen=True)
class MediaLimits:
    """The server's image bounds (``serve --max-image-bytes``, ``--max-image-pixels``,
    ``--max-images``).

    Attributes:
        max_image_bytes: largest image file, decoded bytes.
        max_image_pixels: most pixels (width x height) of one image.
        max_images: most images in one request.
        image_dirs: resolved folders whose image files a request may name by path
            (``--image-dir``; :mod:`kit.server.content.image_files`); none by default.
    """

    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_images: int = DEFAULT_MAX_IMAGES
    image_dirs: tuple[Path, ...] = ()  # --image-dir: folders a request may name files in


def bad(where: str, message: str, code: str) -> APIError:
    """A 400 for the part at ``where``: ``param`` is the path, and the message starts with
    it (Anthropic's error body has no ``param``)."""
    return APIError(400, f"{where}: {message}", param=where, code=code)


def size_text(n: int) -> str:
    """``n`` bytes for a message: ``20 MiB``, ``1.5 MiB``, ``812 KiB``, ``12 bytes``."""
    # a size a byte over a limit must not print as the limit: bytes where rounding hides
    if n >= _MIB:
        shown = f"{n / _MIB:.1f}"
        mib = shown.removesuffix(".0") + " MiB"
        return mib if float(shown) * _MIB == n else f"{mib} ({n:,} bytes)"
    if n >= 1024 and n % 1024:
        return f"{n:,} bytes"
    return f"{n >> 10} KiB" if n >= 1024 else f"{n} bytes"


def _encoded_length(n: int) -> int:
    """Characters of standard base64 (padded) for ``n`` bytes."""
    return 4 * ((n + 2) // 3)


def decode_base64(text: Any, where: str, limit: int, what: str, flag: str = "") -> bytes:
    """The bytes of base64 ``text`` (standard or URL-safe alphabet, padding optional,
    whitespace ignored), bounded to ``limit`` decoded bytes: the length of the text is
    checked before anything is decoded.

    Args:
        text: the base64 string from the request.
        where: the part's path, for errors.
        limit: most decoded bytes.
        what: ``image`` or ``audio`` (the error codes are ``<what>_too_large``,
            ``invalid_<what>``).
        flag: the knob that sets ``limit``, named in the message (``--max-image-bytes``).
    Raises:
        APIError: 400 ``<what>_too_large`` past ``limit``, ``invalid_<what>`` when
            ``text`` is not a base64 string.
    """
    if not isinstance(text, str) or not text:
        raise bad(where, f"the {what} data must be a non-empty base64 string",
                  f"invalid_{what}")
    why = f" ({flag})" if flag else ""

    def too_large(size: int, about: str = "about ") -> APIError:
        return bad(where, f"the {what} is {about}{size_text(size)}, over the limit of "
                   f"{size_text(limit)}{why}", f"{what}_too_large")

    # a coarse bound first, before the copy without whitespace (line breaks every 76
    # characters add 1/76th), then the exact one on the base64 alone
    if len(text) > 2 * _encoded_length(limit) + 1024:
        raise too_large(len(text) * 3 // 4)
    clean = "".join(text.split()) if not text.isalnum() else text
    if len(clean) > _encoded_length(limit):
        raise too_large(len(clean) * 3 // 4)
    if "-" in clean or "_" in clean:  # the URL-safe alphabet (Google's JSON accepts it)
        clean = clean.translate(str.maketrans("-_", "+/"))
    clean += "=" * (-len(clean) % 4)
    try:
        data = base64.b64decode(clean, validate=True)
    except (binascii.Error, ValueError):  # ValueError: a non-ASCII character
        # a data: URL where the field takes the base64 alone (OpenAI's input_audio.data,
        # Anthropic's and Gemini's data) is the common slip: say so
        hint = (": this field takes the base64 alone, not a data: URL (send what follows "
                "the comma)") if clean.startswith("data:") else ""
        raise bad(where, f"the {what} data is not valid base64{hint}",
                  f"invalid_{what}") from None
    if len(data) > limit:
        raise too_large(len(data), "")
    return data


def read_image(data: bytes, where: str, limits: MediaLimits) -> ImageInput:
    """``data`` checked as an image: its format (PNG, JPEG, WebP, GIF: by content) and its
    pixel count read from the header, then decoded once to its end, which proves the file
    whole (the pixels are not kept).

    Raises:
        APIError: 400 ``invalid_image`` (not one of the formats, corrupt or truncated),
            ``image_too_large`` (more than ``limits.max_image_pixels`` pixels).
    """
    def invalid(why: str) -> APIError:
        return bad(where, f"the image {why}", "invalid_image")

    def too_many_pixels(w: int, h: int) -> APIError:
        return bad(where, f"the image is {w}x{h} pixels ({w * h:,}), over the limit of "
                   f"{limits.max_image_pixels:,} pixels (--max-image-pixels)",
                   "image_too_large")

    if len(data) > limits.max_image_bytes:
        raise bad(where, f"the image is {size_text(len(data))}, over the limit of "
                  f"{size_text(limits.max_image_bytes)} (--max-image-bytes)",
                  "image_too_large")
    try:  # reads the header only
        img = Image.open(io.BytesIO(data), formats=_OPEN)
    # Pillow's own bound, far past ours by default (its warning: only where warnings are
    # errors, e.g. `python -W error`, which puts it before the filter above)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise bad(where, f"the image has more than the limit of {limits.max_image_pixels:,} "
                  "pixels (--max-image-pixels)", "image_too_large") from None
    except Exception:  # UnidentifiedImageError, and what a broken header raises
        raise invalid("is not a PNG, JPEG, WebP or GIF file (or its header is "
                      "corrupt)") from None
    with img:
        width, height = img.size
        media_type = FORMATS.get(img.format or "")
        if media_type is None:
            raise invalid("is not a PNG, JPEG, WebP or GIF file")
        if width < 1 or height < 1:
            raise invalid(f"has no pixels ({width}x{height})")
        if width * height > limits.max_image_pixels:
            raise too_many_pixels(width, height)
        try:
            with _DECODING:  # every pixel of the (first) frame: a truncated file fails here
                img.load()
                img.close()  # frees the pixels before another decode may start
        except Exception:
            raise invalid("could not be decoded: the file is truncated or "
                          "corrupt") from None
    return ImageInput(data=data, media_type=media_type, width=width, height=height,
                      digest=hashlib.sha256(data).hexdigest())


def refuse_remote(where: str) -> APIError:
    """The 400 for an image at a remote URL: it is not fetched."""
    return bad(where, "remote image URLs are not fetched (this server makes no network "
               "request on a client's behalf); send the image inline, as a data URL "
               f"({_EXAMPLE}) or base64", "unsupported_value")


def refuse_file(where: str) -> APIError:
    """The 400 for a file on the server's disk (``file://``, a path) when no
    ``--image-dir`` allows it."""
    return bad(where, "files are not read from the server's disk (unless it was started "
               f"with --image-dir); send the image inline, as a data URL ({_EXAMPLE}) or "
               "base64", "unsupported_value")


def refuse_file_id(where: str) -> APIError:
    """The 400 for a file store's id (Anthropic's Files API, OpenAI's ``file_id``)."""
    return bad(where, "file ids are not supported: this server stores no files; send the "
               f"image inline, as a data URL ({_EXAMPLE}) or base64", "unsupported_value")


class MediaReader:
    """One request's media, as its translation meets them: whether the loaded model takes
    images and audio, the server's bounds, and how many images and clips were read so far
    (the count bounds).

    Attributes:
        limits: the bounds.
        vision: the loaded model takes images (``capabilities()["vision"]``); when False the
            translation refuses every media part as a text-only model does, unread.
        audio: it takes audio too (``capabilities()["audio"]``; only a vision model does).
        count: images read so far.
    """

    def __init__(self, limits: MediaLimits | None = None, vision: bool = False,
                 audio: bool = False) -> None:
        self.limits = limits or MediaLimits()
        self.vision = vision
        self.audio = audio and vision
        self.count = 0
        self._clips = AudioBudget()

    def _next(self, where: str) -> None:
        self.count += 1
        if self.count > self.limits.max_images:
            n = self.limits.max_images
            raise bad(where, f"more than {n} image{'s' * (n != 1)} in one request "
                      "(--max-images)", "too_many_images")

    def image_base64(self, text: Any, where: str) -> ImageInput:
        """The image of base64 ``text`` (see :func:`decode_base64`, :func:`read_image`).

        Raises:
            APIError: 400 past a bound, or for data that is not such an image.
        """
        self._next(where)
        data = decode_base64(text, where, self.limits.max_image_bytes, "image",
                             "--max-image-bytes")
        return read_image(data, where, self.limits)

    def image_url(self, url: Any, where: str) -> ImageInput:
        """The image of a URL as OpenAI's APIs carry it: a base64 data URL
        (``data:image/png;base64,...``); http(s), ``file:`` and anything else refused.

        Raises:
            APIError: 400 ``unsupported_value`` for a remote URL or a file,
                ``invalid_image`` for another URL or a data URL that is not base64, or the
                bounds' (:meth:`image_base64`).
        """
        if not isinstance(url, str) or not url:
            raise bad(where, f"the image URL is missing (a data URL: {_EXAMPLE})",
                      "invalid_image")
        head = url[:16].lower()
        if head.startswith(("http://", "https://")):
            raise refuse_remote(where)
        if head.startswith("file:") or head.startswith(("/", "~", ".")):
            return self.image_file(url, where)
        if not head.startswith("data:"):
            raise bad(where, f"the image URL must be a data URL ({_EXAMPLE})",
                      "invalid_image")
        comma = url.find(",", 0, 256)
        if comma < 0 or not url[5:comma].lower().endswith(";base64"):
            raise bad(where, f"a data URL must be base64-encoded ({_EXAMPLE})",
                      "invalid_image")
        return self.image_base64(url[comma + 1:], where)

    def image_file(self, uri: str, where: str) -> ImageInput:
        """The image of a local path or ``file:`` URL, read only inside ``--image-dir``'s
        folders (:func:`kit.server.content.image_files.read_image_file`).

        Raises:
            APIError: 400 ``unsupported_value`` without ``--image-dir`` or outside its
                folders; the file's and the image's bounds.
        """
        if not self.limits.image_dirs:
            raise refuse_file(where)
        self._next(where)
        data = read_image_file(uri, self.limits.image_dirs, self.limits.max_image_bytes,
                               where, bad)
        return read_image(data, where, self.limits)

    def audio_base64(self, text: Any, declared: str | None, where: str) -> AudioInput:
        """The clip of base64 ``text``, bounded (:data:`MAX_AUDIO_BYTES`, then
        :func:`~kit.server.content.audio.read_wav`), on a model that takes audio.

        Args:
            declared: the format the client named (``wav``, ``audio/wav``...), or None.
        Raises:
            APIError: 400 past a bound or for a file that is not PCM WAV; after the bounds,
                ``unsupported_content`` on a model that takes no audio.
        """
        data = decode_base64(text, where, MAX_AUDIO_BYTES, "audio")
        clip = read_wav(data, declared, where)
        if not self.audio:
            raise refuse_audio(where)
        if clip is None:
            raise refuse_format(declared, where)
        return self._clips.add(clip, where)

    def refuse(self, kind: str, where: str) -> APIError:
        """The 400 ``unsupported_content`` for content a vision model cannot take either
        (files, documents, audio), named by the part's type."""
        kind = {"input_file": "file", "input_audio": "audio"}.get(kind, kind)
        return bad(where, f"{kind} content is not supported by this model",
                   "unsupported_content")


__all__ = ["DEFAULT_MAX_IMAGES", "DEFAULT_MAX_IMAGE_BYTES", "DEFAULT_MAX_IMAGE_PIXELS",
           "FORMATS", "MediaLimits", "MediaReader",
           "bad", "decode_base64", "read_image",
           "refuse_file", "refuse_file_id", "refuse_remote", "size_text"]
