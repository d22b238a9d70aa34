"""The records of :mod:`kit.engine.proc.wire`: one pydantic model per message kind between the
server and its engine process (``extra="forbid"``, strict, a bound on every string, list
and payload), and exceptions as :class:`ErrorRecord` records, rebuilt from an allow-list
(:data:`ALLOWED`). Pure Python, no mlx.

Where the engine's other models plug in: a state report's :class:`Status` (today
:meth:`kit.engine.decode.engine.Engine.snapshot`'s keys less ``model_info``; EngineStatus can
take its place in :class:`State`), and ``init``'s options, which are
:class:`kit.engine.distributed.world_codec.Setup`'s (its ``options``: the whole
:class:`kit.config.EngineConfig`, secrets blanked, on this socket and the ring alike).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue

from kit.engine.interface import SwapResult
from kit.engine.types import (
    ChatRequest,
    EngineError,
    Finished,
    ReasoningDelta,
    Started,
    TextDelta,
    ToolCall,
)
from kit.engine.distributed.world_codec import Setup
from kit.errors import (
    ConfigError,
    EngineUnavailable,
    InvalidRequest,
    KitError,
    ModelDoesNotFitError,
    ModelError,
    ModelLoadError,
    ModelNotFoundError,
    ModelUnavailable,
)
from kit.models.resolve import InvalidModelSpec

_KIB, _MIB = 1 << 10, 1 << 20
#: the largest request (a chat request of up to --max-body-size, which may be raised; its
#: images cross in base64, as they came in the body)
REQUEST_BYTES = 1 << 30
#: the largest message the engine sends (a tool call's arguments may be long)
EVENT_BYTES = 64 * _MIB

class WireError(EngineError):
    """A frame this side refuses: not ours (``ident`` None: the link is ended), or of a
    known kind but past its bound or not its schema (``ident``: the request or call it
    names; ``stream``: ``"ev"``, ``"reply"``, ``"state"`` or None, where it belongs)."""

    def __init__(self, message: str, ident: int | None = None,
                 stream: str | None = None) -> None:
        super().__init__(message)
        self.ident, self.stream = ident, stream


#: the most images one request carries, and the largest (``serve --max-images`` and
#: ``--max-image-bytes`` are bounded below these)
MAX_IMAGES = 64
IMAGE_BYTES = 64 * _MIB
#: the media types an image crosses with (kit/server/content/media.py reads no other)
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})
_DIGEST = re.compile(r"[0-9a-f]{64}")
#: the most audio clips one request carries, the largest, and the longest (the HTTP side's
#: bounds, kit/server/content/audio.py, are below these)
MAX_AUDIO = 64
AUDIO_BYTES = 64 * _MIB
AUDIO_SECONDS = 3600.0


def _bounded_media(request: ChatRequest) -> ChatRequest:
    """``request`` when its images are within the wire's bounds (:data:`MAX_IMAGES`,
    :data:`IMAGE_BYTES`, :data:`IMAGE_TYPES`, a size, a SHA-256 digest), and its audio
    clips within theirs (:data:`MAX_AUDIO`, :data:`AUDIO_BYTES`, :data:`AUDIO_SECONDS`).

    Raises:
        ValueError: naming the image and the bound (the receiver's WireError).
    """
    if len(request.images) > MAX_IMAGES:
        raise ValueError(f"{len(request.images)} images, past the bound of {MAX_IMAGES}")
    for i, image in enumerate(request.images):
        if len(image.data) > IMAGE_BYTES:
            raise ValueError(f"image {i} is {len(image.data)} bytes, past the bound of "
                             f"{IMAGE_BYTES}")
        if image.media_type not in IMAGE_TYPES:
            raise ValueError(f"image {i}'s media type is not one of {sorted(IMAGE_TYPES)}")
        if not (0 < image.width < 1 << 31 and 0 < image.height < 1 << 31):
            raise ValueError(f"image {i}'s size is out of range")
        if not _DIGEST.fullmatch(image.digest):
            raise ValueError(f"image {i}'s digest is not a SHA-256 in hex")
    if len(request.audio) > MAX_AUDIO:
        raise ValueError(f"{len(request.audio)} audio clips, past the bound of {MAX_AUDIO}")
    for i, clip in enumerate(request.audio):
        if len(clip.data) > AUDIO_BYTES:
            raise ValueError(f"audio {i} is {len(clip.data)} bytes, past the bound of "
                             f"{AUDIO_BYTES}")
        if not (0 <= clip.seconds <= AUDIO_SECONDS and 0 < clip.sample_rate < 1 << 24):
            raise ValueError(f"audio {i}'s duration or sample rate is out of range")
        if not _DIGEST.fullmatch(clip.digest):
            raise ValueError(f"audio {i}'s digest is not a SHA-256 in hex")
    return request


#: A ChatRequest whose images and audio are bounded (:func:`_bounded_media`).
_Request = Annotated[ChatRequest, AfterValidator(_bounded_media)]


class _Rec(BaseModel):
    # bytes (an image's data) cross as base64 text: JSON has no bytes, and no pickle is used
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              ser_json_bytes="base64", val_json_bytes="base64")
    KIND: ClassVar[int]
    TAG: ClassVar[str]  # the tuple's first item
    MAX_BYTES: ClassVar[int]
    STREAM: ClassVar[str | None] = None  # what a refused one fails (see WireError)


_Text = Annotated[str, Field(max_length=64 * _KIB)]
_Name = Annotated[str, Field(max_length=4096)]


class ErrorRecord(BaseModel):
    """An exception: ``type`` its class name; ``message`` and ``hint`` (cut to their
    bounds by the sender); the fields of kit's errors that have them (InvalidRequest:
    ``code``, ``field``; ModelDoesNotFitError: ``needed``, ``budget`` in bytes;
    ModelNotFoundError: ``model``, ``available``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    type: str = Field(max_length=128)
    message: _Text
    hint: _Text | None = None
    code: str | None = Field(None, max_length=256)
    field: str | None = Field(None, max_length=256)
    needed: int | None = Field(None, ge=0)
    budget: int | None = Field(None, ge=0)
    model: _Name | None = None
    available: list[_Name] | None = Field(None, max_length=4096)


#: the error classes rebuilt as themselves on arrival; any other crosses as EngineError
ALLOWED: dict[str, type[KitError]] = {c.__name__: c for c in (
    KitError, ConfigError, ModelError, ModelNotFoundError, ModelDoesNotFitError,
    InvalidModelSpec, EngineError, InvalidRequest, ModelUnavailable, ModelLoadError,
    EngineUnavailable, WireError)}
_FIELDS = ((InvalidRequest, ("code", "field")), (ModelDoesNotFitError, ("needed", "budget")),
           (ModelNotFoundError, ("model", "available")))


def error_record(error: BaseException) -> ErrorRecord:
    """``error`` as a record, its texts cut to their bounds (an error always crosses)."""
    def cut(text: Any, n: int = 64 * _KIB) -> str | None:
        return None if text is None else str(text)[:n]
    fields: dict[str, Any] = {}
    for cls, names in _FIELDS:
        if isinstance(error, cls):
            fields = {k: getattr(error, k, None) for k in names}
    if "available" in fields:
        fields["available"] = [cut(a, 4096) for a in (fields["available"] or [])][:4096]
    for k in ("code", "field", "model"):
        if k in fields:
            fields[k] = cut(fields[k], 256 if k != "model" else 4096)
    for k in ("needed", "budget"):
        if k in fields and not (type(fields[k]) is int and fields[k] >= 0):
            fields[k] = None
    message = getattr(error, "message", None) if isinstance(error, KitError) else None
    return ErrorRecord(type=type(error).__name__[:128],
                       message=cut(message if message is not None else str(error)) or "",
                       hint=cut(getattr(error, "hint", None)), **fields)


def rebuild_error(record: ErrorRecord) -> KitError:
    """The exception ``record`` describes: its own class when :data:`ALLOWED`, with its
    message, hint and fields; else an :class:`EngineError` ``"<type>: <message>"``."""
    cls = ALLOWED.get(record.type)
    if cls is None:
        return EngineError(f"{record.type}: {record.message}", hint=record.hint)
    error = cls.__new__(cls)  # not __init__: some format their message from fields
    Exception.__init__(error, record.message)
    error.message, error.hint = record.message, record.hint
    if cls is WireError:
        error.ident = error.stream = None
    for base, names in _FIELDS:
        if issubclass(cls, base):
            for k in names:
                setattr(error, k, getattr(record, k))
    return error


# -- server -> engine ---------------------------------------------------------------------

class Gen(_Rec):
    """``("gen", jid, ChatRequest)``: run a request; its events come back under ``jid``
    (its images' bytes as base64, bounded: :func:`_bounded_media`)."""
    KIND, TAG, MAX_BYTES, STREAM = 1, "gen", REQUEST_BYTES, "ev"
    request: _Request


class Cancel(_Rec):
    """``("cancel", jid)``: stop request ``jid``."""
    KIND, TAG, MAX_BYTES = 2, "cancel", 64


class SwapTo(_Rec):
    """``("swap", cid, spec)``: swap to ``spec``; a reply comes back under ``cid``."""
    KIND, TAG, MAX_BYTES, STREAM = 3, "swap", 16 * _KIB, "reply"
    spec: _Name


class Count(_Rec):
    """``("count", cid, ChatRequest)``: count the request's prompt tokens (images as
    :class:`Gen`'s)."""
    KIND, TAG, MAX_BYTES, STREAM = 4, "count", REQUEST_BYTES, "reply"
    request: _Request


class Memory(_Rec):
    """``("memory", cid, None)``: the allocator's counters now."""
    KIND, TAG, MAX_BYTES, STREAM = 5, "memory", 64, "reply"


class Stop(_Rec):
    """``("stop",)``: cancel what runs and exit."""
    KIND, TAG, MAX_BYTES = 6, "stop", 64


class Init(_Rec):
    """``("init", ModelInfo, options, log_level)``: a distributed engine's first message to
    rank 0 (:class:`kit.engine.distributed.world_codec.Setup`, the record rank 0 then shares)."""
    KIND, TAG, MAX_BYTES = 7, "init", 64 * _KIB
    setup: Setup


# -- engine -> server ---------------------------------------------------------------------

class StartedEv(_Rec):
    """``("ev", jid, Started)``."""
    KIND, TAG, MAX_BYTES, STREAM = 16, "ev", 64 * _KIB, "ev"
    event: Started


class TextEv(_Rec):
    """``("ev", jid, TextDelta)`` (with its logprobs)."""
    KIND, TAG, MAX_BYTES, STREAM = 17, "ev", 32 * _MIB, "ev"
    event: TextDelta


class ReasoningEv(_Rec):
    """``("ev", jid, ReasoningDelta)``."""
    KIND, TAG, MAX_BYTES, STREAM = 18, "ev", 32 * _MIB, "ev"
    event: ReasoningDelta


class ToolCallEv(_Rec):
    """``("ev", jid, ToolCall)`` (its arguments may be long)."""
    KIND, TAG, MAX_BYTES, STREAM = 19, "ev", EVENT_BYTES, "ev"
    event: ToolCall


class FinishedEv(_Rec):
    """``("ev", jid, Finished)``, with its usage."""
    KIND, TAG, MAX_BYTES, STREAM = 20, "ev", EVENT_BYTES, "ev"  # a stop string of any length
    event: Finished


class EndEv(_Rec):
    """``("ev", jid, WIRE_END)``: the request's last item."""
    KIND, TAG, MAX_BYTES, STREAM = 21, "ev", 64, "ev"


class ErrorEv(_Rec):
    """``("ev", jid, exception)``: the request failed (END follows)."""
    KIND, TAG, MAX_BYTES, STREAM = 22, "ev", EVENT_BYTES, "ev"  # its fields bound it
    error: ErrorRecord


class SwapReply(_Rec):
    """``("reply", cid, SwapResult, None)``."""
    KIND, TAG, MAX_BYTES, STREAM = 32, "reply", 64 * _KIB, "reply"
    result: SwapResult


class CountReply(_Rec):
    """``("reply", cid, tokens, None)``."""
    KIND, TAG, MAX_BYTES, STREAM = 33, "reply", 256, "reply"
    tokens: int = Field(ge=0, lt=1 << 63)


class MemoryReply(_Rec):
    """``("reply", cid, {active_bytes, peak_bytes, weights_bytes}, None)``."""
    KIND, TAG, MAX_BYTES, STREAM = 34, "reply", 4 * _KIB, "reply"
    memory: dict[Annotated[str, Field(max_length=64)], int | None] = Field(max_length=32)


class ErrorReply(_Rec):
    """``("reply", cid, None, exception)``."""
    KIND, TAG, MAX_BYTES, STREAM = 35, "reply", EVENT_BYTES, "reply"
    error: ErrorRecord


_Json = dict[Annotated[str, Field(max_length=256)], JsonValue]


class Status(BaseModel):
    """What :meth:`kit.engine.decode.engine.Engine.snapshot` reports, less ``model_info``
    (:class:`State` carries it): a closed set of keys, so a report sets no attribute of
    the server's engine but these (EngineStatus plugs in here). ``distributed``: a rank
    0's ``/health`` list of ranks, absent for a single engine."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    state: str = Field(max_length=32)
    error: _Text | None
    error_type: str | None = Field(max_length=128)
    requests_served: int = Field(ge=0)
    swaps: int = Field(ge=0)
    reloads: int = Field(ge=0)
    unloads: int = Field(ge=0)
    load_seconds: float | None
    phase: str | None = Field(max_length=256)
    memory: dict[Annotated[str, Field(max_length=64)], int | None] = Field(max_length=32)
    capabilities: _Json = Field(max_length=64)
    admission: _Json = Field(max_length=256)
    prompt_cache: _Json | None = Field(max_length=256)
    kv_cache: _Json = Field(max_length=256)
    distributed: _Json | None = Field(None, max_length=64)
    draft: _Json | None = Field(None, max_length=64)


class ModelRef(BaseModel):
    """A :class:`kit.models.resolve.ModelInfo`: id, folder, context window (tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    id: _Name
    path: _Name
    context_window: int = Field(ge=1, le=1 << 40)


class State(_Rec):
    """``("state", snapshot)``: the engine's state after a change (its model, its
    :class:`Status`)."""
    KIND, TAG, MAX_BYTES, STREAM = 40, "state", 4 * _MIB, "state"
    model: ModelRef
    status: Status


KINDS: dict[int, type[_Rec]] = {r.KIND: r for r in (
    Gen, Cancel, SwapTo, Count, Memory, Stop, Init, StartedEv, TextEv, ReasoningEv,
    ToolCallEv, FinishedEv, EndEv, ErrorEv, SwapReply, CountReply, MemoryReply,
    ErrorReply, State)}
