"""What the server and its engine process (or a distributed engine's rank 0) send each
other: a typed, versioned encoding, so no bytes that cross decode into anything but these
records (nothing is unpickled, nothing that arrives names code to run).

A frame is one ``Connection.send_bytes`` message (read with ``recv_bytes(maxlength=...)``,
which refuses an over-long frame before reading it):

``MAGIC "MKP" (3) | version (1) | kind (1) | id (8, the request's or call's; 0 if none) |
JSON payload``

Each kind has one pydantic record (:mod:`kit.engine.proc.wire_records`: ``extra="forbid"``,
strict, bounds on every string and list) and a bound on its payload's size, checked
before the payload is parsed. The modules
on either side keep their tuples (:func:`encode` takes one, :func:`decode` gives one back;
the tuples are listed in :mod:`kit.engine.proc.process`); the records are only the bytes.

- A frame that is not ours (too short, wrong magic or version, an unknown kind) raises a
  :class:`WireError` with no id: the link cannot be trusted further and is ended.
- A frame of a known kind whose payload is past its bound or does not validate raises a
  :class:`WireError` naming the id and which stream it belongs to (``stream``: ``"ev"``,
  ``"reply"`` or ``"state"``): the receiver fails that request or call alone.
- An exception crosses as an :class:`ErrorRecord`: its class name, message, hint and the
  fields kit's errors carry; rebuilt as that class when it is one of :data:`ALLOWED`,
  else as an :class:`EngineError` naming the class.

Why JSON and not msgpack: pydantic parses and checks JSON in one pass in Rust (no extra
dependency, no intermediate dict; msgpack would need a dict built and then validated),
and an event costs a few µs, as a pickle did: a text delta 4.7 µs encoded and decoded
(2.8 pickled), 9.5 µs through a real pipe (11.3), bench/engine_wire.py. Pure Python, no
mlx: the HTTP process imports it.

Where the engine's other models plug in: see :mod:`kit.engine.proc.wire_records` (a state
report's ``Status``, the ``init`` options).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError, to_json

from kit.engine.interface import SwapResult
from kit.engine.types import Finished, ReasoningDelta, Started, TextDelta, ToolCall
from kit.engine.proc.wire_records import (  # noqa: F401  (ALLOWED, the records: wire's names)
    ALLOWED,
    EVENT_BYTES,
    KINDS,
    REQUEST_BYTES,
    Cancel,
    Count,
    CountReply,
    EndEv,
    ErrorEv,
    ErrorRecord,
    ErrorReply,
    FinishedEv,
    Gen,
    Init,
    Memory,
    MemoryReply,
    ModelRef,
    ReasoningEv,
    StartedEv,
    State,
    Status,
    Stop,
    SwapReply,
    SwapTo,
    TextEv,
    ToolCallEv,
    WireError,
    _Rec,
    error_record,
    rebuild_error,
)
from kit.engine.distributed.world_codec import setup_of
from kit.models.resolve import ModelInfo
from kit.engine.decode.bridge import END

VERSION = 1
MAGIC = b"MKP"
_HEADER = struct.Struct(">3sBBQ")
#: ``recv_bytes`` bounds: what the engine reads (requests), what the server reads
TO_ENGINE_MAX = _HEADER.size + REQUEST_BYTES
TO_SERVER_MAX = _HEADER.size + EVENT_BYTES
#: the end of a request's events on the wire (:data:`kit.engine.decode.bridge.END` is an
#: ``object()``: it cannot cross); ``decode`` gives it back as this string
WIRE_END = "end"


_EVENTS: dict[type, type[_Rec]] = {Started: StartedEv, TextDelta: TextEv,
                                   ReasoningDelta: ReasoningEv, ToolCall: ToolCallEv,
                                   Finished: FinishedEv}


def _record(message: tuple) -> tuple[_Rec | tuple[type[_Rec], dict], int]:
    """The record of a tuple (see the module docstring), or its kind and fields, and its
    id."""
    tag = message[0]
    if tag == "ev":
        item = message[2]
        kind = _EVENTS.get(type(item))
        if kind is not None:  # one per token: dumped as is (the receiver validates)
            return (kind, {"event": item}), message[1]
        if isinstance(item, BaseException):
            return ErrorEv(error=error_record(item)), message[1]
        if isinstance(item, str) and item == WIRE_END:
            return EndEv(), message[1]

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
        if isinstance(snap.get("error"), str):  # a report must never fail on its text
            snap["error"] = snap["error"][:64 << 10]
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
    """The frame of ``message`` (one of the tuples in :mod:`kit.engine.proc.process`).

    Raises:
        WireError: no record for it, a value out of its record's range, or a payload
            past its kind's bound.
    """
    try:
        record, ident = _record(message)
    except ValidationError as e:
        raise WireError(f"a {message[0]!r} message out of its record's range "
                        f"({str(e).splitlines()[0][:300]})") from None
    cls = record[0] if isinstance(record, tuple) else type(record)
    try:
        payload = (to_json(record[1]) if isinstance(record, tuple)
                   else record.__pydantic_serializer__.to_json(record))
    except PydanticSerializationError as e:
        raise WireError(f"a {cls.__name__} that is not JSON ({str(e)[:300]})") from None
    if len(payload) > cls.MAX_BYTES:
        raise WireError(f"a {cls.__name__} of {len(payload)} bytes is past its "
                        f"bound ({cls.MAX_BYTES})")
    return _HEADER.pack(MAGIC, VERSION, cls.KIND, ident) + payload


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
        record = cls.__pydantic_validator__.validate_json(payload)  # strict: its config
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
        snap = record.status.model_dump()
        for key in ("distributed", "draft"):  # a single engine's, one without a draft
            if snap[key] is None:
                del snap[key]
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
                s.options, s.log_level)
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


def fail_refused(error: WireError, sinks: dict[int, Callable[[Any], None]],
                 calls: dict[int, Future]) -> bool:
    """Fail what a refused frame names with ``error``: the sink of its request (stream
    ``"ev"``) or the future of its call (``"reply"``, removed from ``calls``); a state
    report's is only dropped. A frame not ours at all (stream None) fails every sink and
    call (``calls`` emptied). Returns whether the link can go on (False: end it)."""
    if error.stream is None:
        failed, futures = list(sinks.values()), list(calls.values())
        calls.clear()
    else:
        ident = -1 if error.ident is None else error.ident
        failed = [sinks.get(ident)] if error.stream == "ev" else []
        futures = [calls.pop(ident, None)] if error.stream == "reply" else []
    for sink in failed:
        if sink is not None:
            sink(error)  # the first error is the one the request raises
    for future in futures:
        if future is not None and future.set_running_or_notify_cancel():
            future.set_exception(error)
    return error.stream is not None
