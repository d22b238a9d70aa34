"""What the server and its engine process (or a distributed engine's rank 0) send each
other: a typed, versioned encoding, so no bytes that cross decode into anything but these
records (nothing is unpickled, nothing that arrives names code to run).

A frame is one ``Connection.send_bytes`` message (read with ``recv_bytes(maxlength=...)``,
which refuses an over-long frame before reading it):

``MAGIC "MKP" (3) | version (1) | kind (1) | id (8, the request's or call's; 0 if none) |
JSON payload``

Each kind has one pydantic record (``extra="forbid"``, strict, bounds on every string and
list) and a bound on its payload's size, checked before the payload is parsed. The modules
on either side keep their tuples (:func:`encode` takes one, :func:`decode` gives one back;
the tuples are listed in :mod:`kit.engine.process`); the records are only the bytes.

- A frame that is not ours (too short, wrong magic or version, an unknown kind) raises a
  :class:`WireError` with no id: the link cannot be trusted further and is ended.
- A frame of a known kind whose payload is past its bound or does not validate raises a
  :class:`WireError` naming the id and which stream it belongs to (``stream``: ``"ev"``,
  ``"reply"`` or ``"state"``): the receiver fails that request or call alone.
- An exception crosses as an :class:`ErrorRecord`: its class name, message, hint and the
  fields kit's errors carry; rebuilt as that class when it is one of :data:`ALLOWED`,
  else as an :class:`EngineError` naming the class.

Why JSON and not msgpack: pydantic parses and checks JSON in one pass in Rust (no extra
dependency, no intermediate dict), and an event per token costs about what a pickle did
(bench/engine_wire.py). Pure Python, no mlx: the HTTP process imports it.

Where the engine's other models plug in: :data:`Options` (the ``init`` message's engine
options, today :class:`kit.engine.world_codec.EngineOptions`) and :class:`Status` (a state
report, today :meth:`kit.engine.engine.Engine.snapshot`'s keys) are each one name here.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

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
from kit.engine.world_codec import EngineOptions, Setup, setup_of
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
from kit.models.resolve import InvalidModelSpec, ModelInfo

VERSION = 1
MAGIC = b"MKP"
_HEADER = struct.Struct(">3sBBQ")
_KIB, _MIB = 1 << 10, 1 << 20
#: the largest request (a chat request of up to --max-body-size, which may be raised)
REQUEST_BYTES = 1 << 30
#: ``recv_bytes`` bounds: what the engine reads (requests), what the server reads
TO_ENGINE_MAX = _HEADER.size + REQUEST_BYTES
TO_SERVER_MAX = _HEADER.size + 64 * _MIB
#: the end of a request's events on the wire (:data:`kit.engine.bridge.END` is an
#: ``object()``: it cannot cross); ``decode`` gives it back as this string
WIRE_END = "end"

#: the engine's options in ``init`` (EngineConfig plugs in here)
Options = EngineOptions


class WireError(EngineError):
    """A frame this side refuses: not ours (``ident`` None: the link is ended), or of a
    known kind but past its bound or not its schema (``ident``: the request or call it
    names; ``stream``: ``"ev"``, ``"reply"``, ``"state"`` or None, where it belongs)."""

    def __init__(self, message: str, ident: int | None = None,
                 stream: str | None = None) -> None:
        super().__init__(message)
        self.ident, self.stream = ident, stream


class _Rec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
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
    """``("gen", jid, ChatRequest)``: run a request; its events come back under ``jid``."""
    KIND, TAG, MAX_BYTES, STREAM = 1, "gen", REQUEST_BYTES, "ev"
    request: ChatRequest


class Cancel(_Rec):
    """``("cancel", jid)``: stop request ``jid``."""
    KIND, TAG, MAX_BYTES = 2, "cancel", 64


class SwapTo(_Rec):
    """``("swap", cid, spec)``: swap to ``spec``; a reply comes back under ``cid``."""
    KIND, TAG, MAX_BYTES, STREAM = 3, "swap", 16 * _KIB, "reply"
    spec: _Name


class Count(_Rec):
    """``("count", cid, ChatRequest)``: count the request's prompt tokens."""
    KIND, TAG, MAX_BYTES, STREAM = 4, "count", REQUEST_BYTES, "reply"
    request: ChatRequest


class Memory(_Rec):
    """``("memory", cid, None)``: the allocator's counters now."""
    KIND, TAG, MAX_BYTES, STREAM = 5, "memory", 64, "reply"


class Stop(_Rec):
    """``("stop",)``: cancel what runs and exit."""
    KIND, TAG, MAX_BYTES = 6, "stop", 64


class Init(_Rec):
    """``("init", ModelInfo, options, log_level)``: a distributed engine's first message to
    rank 0 (:class:`kit.engine.world_codec.Setup`, the record rank 0 then shares)."""
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
    KIND, TAG, MAX_BYTES, STREAM = 19, "ev", 64 * _MIB, "ev"
    event: ToolCall


class FinishedEv(_Rec):
    """``("ev", jid, Finished)``, with its usage."""
    KIND, TAG, MAX_BYTES, STREAM = 20, "ev", 64 * _KIB, "ev"
    event: Finished


class EndEv(_Rec):
    """``("ev", jid, WIRE_END)``: the request's last item."""
    KIND, TAG, MAX_BYTES, STREAM = 21, "ev", 64, "ev"


class ErrorEv(_Rec):
    """``("ev", jid, exception)``: the request failed (END follows)."""
    KIND, TAG, MAX_BYTES, STREAM = 22, "ev", 1 * _MIB, "ev"
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
    KIND, TAG, MAX_BYTES, STREAM = 35, "reply", 1 * _MIB, "reply"
    error: ErrorRecord


_Json = dict[Annotated[str, Field(max_length=256)], JsonValue]


class Status(BaseModel):
    """What :meth:`kit.engine.engine.Engine.snapshot` reports, less ``model_info``
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
_EVENTS: dict[type, type[_Rec]] = {Started: StartedEv, TextDelta: TextEv,
                                   ReasoningDelta: ReasoningEv, ToolCall: ToolCallEv,
                                   Finished: FinishedEv}


def _record(message: tuple) -> tuple[_Rec, int]:
    """The record of a tuple (see the module docstring) and its id."""
    tag = message[0]
    if tag == "ev":
        item = message[2]
        kind = _EVENTS.get(type(item))
        if kind is not None:  # built, not validated: the receiver validates
            return kind.model_construct(event=item), message[1]
        if isinstance(item, BaseException):
            return ErrorEv(error=error_record(item)), message[1]
        if isinstance(item, str) and item == WIRE_END:
            return EndEv(), message[1]
        from kit.engine.bridge import END

        if item is END:
            return EndEv(), message[1]
        raise WireError(f"a {type(item).__name__} is not an event")
    if tag == "reply":
        cid, result, error = message[1:]
        if error is not None:
            return ErrorReply(error=error_record(error)), cid
        if isinstance(result, SwapResult):
            return SwapReply.model_construct(result=result), cid
        if type(result) is int:
            return CountReply(tokens=result), cid
        if isinstance(result, dict):
            return MemoryReply(memory=result), cid
        raise WireError(f"a {type(result).__name__} is not a reply")
    if tag == "state":
        snap = dict(message[1])
        info = snap.pop("model_info")
        return State(model=ModelRef(id=info.id, path=str(info.path),
                                    context_window=info.context_window),
                     status=Status.model_validate(snap, strict=False)), 0
    if tag in ("gen", "count"):
        return (Gen if tag == "gen" else Count).model_construct(request=message[2]), message[1]
    if tag == "cancel":
        return Cancel(), message[1]
    if tag == "swap":
        return SwapTo(spec=message[2]), message[1]
    if tag == "memory":
        return Memory(), message[1]
    if tag == "stop":
        return Stop(), 0
    if tag == "init":
        return Init(setup=setup_of(*message[1:])), 0
    raise WireError(f"no record for a {tag!r} message")


def encode(message: tuple) -> bytes:
    """The frame of ``message`` (one of the tuples in :mod:`kit.engine.process`).

    Raises:
        WireError: no record for it, or its payload is past its kind's bound.
        pydantic.ValidationError: a value out of its record's range (the sender's bug).
    """
    record, ident = _record(message)
    payload = record.model_dump_json().encode()
    if len(payload) > record.MAX_BYTES:
        raise WireError(f"a {type(record).__name__} of {len(payload)} bytes is past its "
                        f"bound ({record.MAX_BYTES})")
    return _HEADER.pack(MAGIC, VERSION, record.KIND, ident) + payload


def decode(frame: bytes) -> tuple:
    """The tuple in ``frame`` (see :func:`encode`), every value checked.

    Raises:
        WireError: see the class (never anything else).
    """
    if len(frame) < _HEADER.size:
        raise WireError(f"a frame of {len(frame)} bytes is not one of ours")
    magic, version, kind, ident = _HEADER.unpack_from(frame)
    if magic != MAGIC or version != VERSION:
        raise WireError(f"a frame of version {version} of {magic!r}, not {VERSION} of "
                        f"{MAGIC!r}")
    cls = KINDS.get(kind)
    if cls is None:
        raise WireError(f"a frame of unknown kind {kind}")
    payload = frame[_HEADER.size:]
    if len(payload) > cls.MAX_BYTES:
        raise WireError(f"a {cls.__name__} of {len(payload)} bytes is past its bound "
                        f"({cls.MAX_BYTES})", ident, cls.STREAM)
    try:
        record = cls.model_validate_json(payload, strict=True)
    except (ValidationError, ValueError, RecursionError) as e:
        raise WireError(f"not a {cls.__name__} ({str(e).splitlines()[0][:300]})",
                        ident, cls.STREAM) from None
    return _tuple(record, ident)


def _tuple(record: _Rec, ident: int) -> tuple:
    if isinstance(record, (StartedEv, TextEv, ReasoningEv, ToolCallEv, FinishedEv)):
        return ("ev", ident, record.event)
    if isinstance(record, EndEv):
        return ("ev", ident, WIRE_END)
    if isinstance(record, ErrorEv):
        return ("ev", ident, rebuild_error(record.error))
    if isinstance(record, SwapReply):
        return ("reply", ident, record.result, None)
    if isinstance(record, CountReply):
        return ("reply", ident, record.tokens, None)
    if isinstance(record, MemoryReply):
        return ("reply", ident, dict(record.memory), None)
    if isinstance(record, ErrorReply):
        return ("reply", ident, None, rebuild_error(record.error))
    if isinstance(record, State):
        m = record.model
        snap = record.status.model_dump(exclude_unset=True)
        return ("state", {"model_info": ModelInfo(m.id, Path(m.path), m.context_window),
                          **snap})
    if isinstance(record, (Gen, Count)):
        return (record.TAG, ident, record.request)
    if isinstance(record, SwapTo):
        return ("swap", ident, record.spec)
    if isinstance(record, Memory):
        return ("memory", ident, None)
    if isinstance(record, Cancel):
        return ("cancel", ident)
    if isinstance(record, Init):
        s = record.setup
        return ("init", ModelInfo(s.model_id, Path(s.model_path), s.context_window),
                s.options.model_dump(), s.log_level)
    return ("stop",)


def recv(conn: Any, limit: int) -> tuple:
    """The next message on ``conn`` (a ``multiprocessing`` Connection), at most ``limit``
    bytes (:data:`TO_ENGINE_MAX` or :data:`TO_SERVER_MAX`; longer ones are refused
    before they are read).

    Raises:
        EOFError, OSError: the other end is gone.
        WireError: a frame past ``limit`` (``ident`` None: the stream is out of step, end
            it), or one that :func:`decode` refuses.
    """
    try:
        frame = conn.recv_bytes(limit)
    except OSError as e:
        if e.errno is None and "message length" in str(e):  # multiprocessing's own check
            raise WireError(f"a frame past the pipe's bound ({limit} bytes)") from None
        raise
    return decode(frame)
