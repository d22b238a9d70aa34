"""What the server and its embedding process (:mod:`kit.embed.child`) send each other:
the engine pipe's design (:mod:`kit.engine.proc.wire`) with its own small set of records.

A frame is one ``Connection.send_bytes`` message:
``MAGIC "MKE" (3) | version (1) | kind (1) | id (8, the call's; 0 if none) | JSON payload``.
Each kind is one pydantic record (strict, ``extra="forbid"``, a bound on every string and
list) with a bound on its payload, checked before it is parsed; nothing is unpickled.
Errors cross as the engine pipe's :class:`~kit.engine.proc.wire_records.ErrorRecord` and
are rebuilt from its allow-list. Pure Python, no mlx: the HTTP process imports it.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.engine.proc.wire_records import ErrorRecord, WireError

MAGIC, VERSION = b"MKE", 1
_HEADER = struct.Struct(">3sBBQ")
_KIB, _MIB = 1 << 10, 1 << 20

#: most inputs in one request (OpenAI's own limit for /v1/embeddings)
MAX_INPUTS = 2048
#: most characters in one text input; a window of 8,192 tokens is ~40,000 characters
MAX_TEXT_CHARS = 1 * _MIB
#: most token ids in one token-id input
MAX_INPUT_TOKENS = 1 << 17
#: the largest call (``MAX_INPUTS`` texts, each far below its bound, or ids in JSON)
CALL_BYTES = 1 << 30
#: the largest reply: 2,048 vectors of 8,192 float32 dimensions, base64 (~90 MB)
REPLY_BYTES = 96 * _MIB
#: ``recv_bytes`` bounds of each side
TO_CHILD_MAX = _HEADER.size + CALL_BYTES
TO_SERVER_MAX = _HEADER.size + REPLY_BYTES

_Name = Annotated[str, Field(max_length=4096)]
_Token = Annotated[int, Field(ge=0, lt=1 << 31)]


class _Rec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    KIND: ClassVar[int]
    MAX_BYTES: ClassVar[int]


class EmbedInit(_Rec):
    """The first frame to the child: the model to load (its id and folder), its context
    window (tokens) and the server's log level."""
    KIND, MAX_BYTES = 1, 64 * _KIB
    model_id: _Name
    path: _Name
    context_window: int = Field(ge=1, le=1 << 40)
    log_level: int = Field(ge=0, le=100)


class EmbedCall(_Rec):
    """Embed ``texts`` or ``ids`` (token ids, one list per input; exactly one of the two
    is set). ``truncate``: cut inputs past the model's window to it, else refuse them."""
    KIND, MAX_BYTES = 2, CALL_BYTES
    texts: list[Annotated[str, Field(max_length=MAX_TEXT_CHARS)]] | None = Field(
        None, max_length=MAX_INPUTS)
    ids: list[Annotated[list[_Token], Field(max_length=MAX_INPUT_TOKENS)]] | None = Field(
        None, max_length=MAX_INPUTS)
    truncate: bool = True


class EmbedStop(_Rec):
    """Finish the call in hand and exit."""
    KIND, MAX_BYTES = 3, 64


class EmbedVectors(_Rec):
    """A call's answer: ``vectors``, base64 of ``count`` × ``dims`` little-endian float32
    (L2-normalised rows, in the inputs' order), and the tokens each input took."""
    KIND, MAX_BYTES = 32, REPLY_BYTES
    vectors: str = Field(max_length=REPLY_BYTES)
    count: int = Field(ge=0, le=MAX_INPUTS)
    dims: int = Field(ge=1, le=1 << 16)
    tokens: list[Annotated[int, Field(ge=0)]] = Field(max_length=MAX_INPUTS)


class EmbedFailed(_Rec):
    """A call that failed, or a load that did (id 0)."""
    KIND, MAX_BYTES = 33, 256 * _KIB
    error: ErrorRecord


class EmbedState(_Rec):
    """The model's state after its load: ``ready`` (with its dims, window in tokens,
    weight bytes, load seconds and pooling) or ``failed`` (``error`` says why)."""
    KIND, MAX_BYTES = 40, 256 * _KIB
    state: str = Field(max_length=32)
    error: Annotated[str, Field(max_length=64 * _KIB)] | None = None
    dims: int | None = Field(None, ge=1, le=1 << 16)
    window: int | None = Field(None, ge=1, le=1 << 40)
    weights_bytes: int | None = Field(None, ge=0)
    load_seconds: float | None = Field(None, ge=0)
    pooling: str | None = Field(None, max_length=32)


KINDS: dict[int, type[_Rec]] = {r.KIND: r for r in (
    EmbedInit, EmbedCall, EmbedStop, EmbedVectors, EmbedFailed, EmbedState)}


def encode(record: _Rec, ident: int = 0) -> bytes:
    """The frame of ``record`` for call ``ident``.

    Raises:
        WireError: its payload is past its kind's bound.
    """
    payload = record.__pydantic_serializer__.to_json(record)
    if len(payload) > record.MAX_BYTES:
        raise WireError(f"a {type(record).__name__} of {len(payload)} bytes is past its "
                        f"bound ({record.MAX_BYTES})")
    return _HEADER.pack(MAGIC, VERSION, record.KIND, ident) + payload


def decode(frame: bytes) -> tuple[Any, int]:
    """``(record, ident)`` of ``frame``, every value checked.

    Raises:
        WireError: not a frame of ours (``ident`` None), or a known kind whose payload is
            past its bound or not its schema (``ident``: the call it names).
    """
    if len(frame) < _HEADER.size:
        raise WireError(f"a frame of {len(frame)} bytes is not one of ours")
    magic, version, kind, ident = _HEADER.unpack_from(frame)
    cls = KINDS.get(kind)
    if magic != MAGIC or version != VERSION or cls is None:
        raise WireError(f"a frame of kind {kind}, version {version} of {magic!r} is not "
                        "one of ours")
    payload = frame[_HEADER.size:]
    if len(payload) > cls.MAX_BYTES:
        raise WireError(f"a {cls.__name__} of {len(payload)} bytes is past its bound",
                        ident, "reply")
    try:
        return cls.__pydantic_validator__.validate_json(payload), ident
    except (ValidationError, ValueError, RecursionError) as e:
        raise WireError(f"not a {cls.__name__} ({str(e).splitlines()[0][:300]})",
                        ident, "reply") from None


def recv(conn: Any, limit: int) -> tuple[Any, int]:
    """The next ``(record, ident)`` on ``conn``, at most ``limit`` bytes.

    Raises:
        EOFError, OSError: the other end is gone.
        WireError: a frame past ``limit`` (``ident`` None) or one :func:`decode` refuses.
    """
    try:
        frame = conn.recv_bytes(limit)
    except OSError as e:
        if e.errno is None and "message length" in str(e):
            raise WireError(f"a frame past the pipe's bound ({limit} bytes)") from None
        raise
    return decode(frame)
