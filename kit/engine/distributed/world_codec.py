"""What the ranks of a distributed engine send each other, as authenticated frames: a
typed, versioned JSON encoding of one record kind per message, each frame under an
HMAC-SHA256 of a per-world secret with the share's sequence number, so no bytes another
process puts on the ring decode into anything but these records (nothing is unpickled),
and a relay can neither inject, alter nor replay a share.

A share is two ring ``all_sum``s (see :class:`kit.engine.distributed.world.World`): a prelude of two
int64s, the frame's length and :func:`length_tag` (a MAC of the length, truncated to 63
bits, so an idle tick's empty share is authenticated in the one collective it costs),
then the frame:

``MAGIC (4) | version (1) | kind (1) | root rank (1) | 0 (1) | seq (8) | length (4) |
JSON payload | HMAC-SHA256(key, everything before it) (32)``

Every rank counts the shares it takes part in (every share is collective, in the same
order on every rank), so each knows the sequence number, the kind and the sending rank it
expects: a frame for another place in the stream (a replay) fails its MAC check, as does
any altered byte. Pure Python (no mlx): the HTTP server's tests use it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.config import EngineConfig
from kit.engine.types import ChatRequest

VERSION = 1
MAGIC = b"MKWS"
KEY_BYTES = 32
#: the environment variable that hands a local rank the world's secret (hex); never argv
KEY_ENV = "MLX_KIT_WORLD_KEY"
_HEADER = struct.Struct(">4sBBBxQI")
_MAC_BYTES = 32
_TAG_MASK = (1 << 63) - 1  # the prelude is int64: a non-negative tag of 63 bits


class ShareError(Exception):
    """A frame that is not the expected record from the expected rank at the expected
    place in the stream: wrong length, magic, version, kind, rank or sequence number, a
    failed MAC, or a payload that is not the kind's schema. The world turns it into a
    :class:`kit.engine.distributed.world.WorldTampered` naming the link."""


class Record(BaseModel):
    """A record kind that crosses the ring. ``KIND``: its id in the frame header;
    ``MAX_BYTES``: the largest payload it may have (checked before anything is read)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    KIND: ClassVar[int]
    MAX_BYTES: ClassVar[int]


_Name = Field(max_length=4096)


class Setup(Record):
    """Rank 0's first share: the model to load, the engine's config (whole, without
    secrets), the log level."""

    KIND, MAX_BYTES = 1, 64 << 10
    model_id: str = _Name
    model_path: str = _Name
    context_window: int = Field(ge=1, le=1 << 40)
    options: EngineConfig
    log_level: int = Field(ge=0, le=100)


class Seed(Record):
    """The random generator's state every rank takes (rank 0 draws it)."""

    KIND, MAX_BYTES = 2, 256
    value: int = Field(ge=0, lt=1 << 32)


class Hello(Record):
    """The proof's first round: each rank's fresh challenge (32 random bytes, hex)."""

    KIND, MAX_BYTES = 3, 512
    nonce: str = Field(pattern=r"^[0-9a-f]{64}$")


class Proof(Record):
    """The proof's second round: HMAC(key, rank and every rank's challenge), hex."""

    KIND, MAX_BYTES = 4, 512
    mac: str = Field(pattern=r"^[0-9a-f]{64}$")


class Fault(Record):
    """One rank's outcome of a check every rank ran (``World.agree``): None-free; a rank
    that passed shares no Fault. ``kind``: :func:`kit.errors.error_kind` of a
    :class:`kit.errors.KitError` subclass (an unknown one is rebuilt as ModelError)."""

    KIND, MAX_BYTES = 5, 256 << 10
    kind: str = Field(max_length=64)
    message: str = Field(max_length=64 << 10)
    hint: str | None = Field(None, max_length=16 << 10)
    host: str = _Name
    code: str | None = Field(None, max_length=256)
    field: str | None = Field(None, max_length=256)
    needed: int | None = Field(None, ge=0)
    budget: int | None = Field(None, ge=0)


class Alike(Record):
    """What must be the same on every rank: versions, device kind, prefill chunk."""

    KIND, MAX_BYTES = 6, 4 << 10
    mlx: str = Field(max_length=128)
    mlx_lm: str = Field(max_length=128)
    kit: str = Field(max_length=128)
    device: str = Field(max_length=256)
    prefill: int = Field(ge=1, le=1 << 24)


class Machine(Record):
    """A rank's machine: host name and MAC address (``uuid.getnode``)."""

    KIND, MAX_BYTES = 7, 1 << 10
    host: str = _Name
    node: int = Field(ge=0, lt=1 << 64)


class RankFacts(Record):
    """A rank's line in ``/health``'s ``distributed.ranks``."""

    KIND, MAX_BYTES = 8, 16 << 10
    rank: int = Field(ge=0, lt=1 << 16)
    host: str = _Name
    hostname: str = _Name
    pid: int = Field(ge=0)
    memory: dict[str, int | None] = Field(max_length=32)


class Gen(BaseModel):
    """A queued request (``jid``: the pipe's id of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    jid: int = Field(ge=0, lt=1 << 63)
    request: ChatRequest


class SwapTo(BaseModel):
    """A queued swap to ``spec``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    spec: str = _Name


class Stop(BaseModel):
    """A queued stop."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    stop: bool = True


class Arrivals(Record):
    """What rank 0's queue took in since the last sync (``kit.engine.distributed.rank_inbox``)."""

    KIND, MAX_BYTES = 9, 1 << 30  # several requests of up to the body limit each
    items: list[Gen | SwapTo | Stop] = Field(max_length=1 << 16)
    cancels: list[int] = Field(max_length=1 << 16)
    timed_out: bool


KINDS: dict[int, type[Record]] = {
    r.KIND: r for r in (Setup, Seed, Hello, Proof, Fault, Alike, Machine, RankFacts, Arrivals)}


def max_frame_bytes(kind: type[Record]) -> int:
    """The longest frame of ``kind``: header, its payload bound, MAC."""
    return _HEADER.size + kind.MAX_BYTES + _MAC_BYTES


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def length_tag(key: bytes, seq: int, root: int, size: int) -> int:
    """The prelude's MAC of a share's frame length (0: no share) at ``seq`` from
    ``root``, as a non-negative int64."""
    data = b"MKWL" + struct.pack(">BQQ", root, seq, size)
    return int.from_bytes(_mac(key, data)[:8], "big") & _TAG_MASK


def check_length(key: bytes, seq: int, root: int, size: int, tag: int,
                 kind: type[Record]) -> None:
    """Check a prelude (``size``, ``tag``) before anything is allocated for the frame.

    Raises:
        ShareError: a tag that is not ours, or a length past ``kind``'s bound.
    """
    if not hmac.compare_digest(length_tag(key, seq, root, size).to_bytes(8, "big"),
                               (tag & _TAG_MASK).to_bytes(8, "big")) or tag < 0:
        raise ShareError(f"share {seq}'s length ({size} bytes) failed its MAC check")
    if size and not _HEADER.size + _MAC_BYTES < size <= max_frame_bytes(kind):
        raise ShareError(f"share {seq}: a {kind.__name__} of {size} bytes is past its "
                         f"bound ({max_frame_bytes(kind)})")


def encode(key: bytes, seq: int, root: int, record: Record) -> bytes:
    """The frame of ``record``, sent by rank ``root`` as share ``seq``.

    Raises:
        ShareError: the payload is past the kind's bound (the sender's own error).
    """
    payload = record.model_dump_json().encode()
    if len(payload) > record.MAX_BYTES:
        raise ShareError(f"a {type(record).__name__} of {len(payload)} bytes is past its "
                         f"bound ({record.MAX_BYTES})")
    header = _HEADER.pack(MAGIC, VERSION, record.KIND, root, seq, len(payload))
    return header + payload + _mac(key, header + payload)


def decode(key: bytes, seq: int, root: int, kind: type[Record], frame: bytes) -> Record:
    """The ``kind`` record in ``frame``, checked to be share ``seq`` from rank ``root``
    under ``key`` (MAC first: nothing unauthenticated is parsed).

    Raises:
        ShareError: anything else (see the class).
    """
    if not _HEADER.size + _MAC_BYTES <= len(frame) <= max_frame_bytes(kind):
        raise ShareError(f"share {seq}: {len(frame)} bytes is not a {kind.__name__} frame")
    body, mac = frame[:-_MAC_BYTES], frame[-_MAC_BYTES:]
    if not hmac.compare_digest(_mac(key, body), mac):
        raise ShareError(f"share {seq} (a {kind.__name__} from rank {root}) failed its "
                         "MAC check")
    magic, version, got_kind, got_root, got_seq, size = _HEADER.unpack_from(body)
    if magic != MAGIC or version != VERSION:
        raise ShareError(f"share {seq}: version {version} of {magic!r}, not {VERSION}")
    if (got_kind, got_root, got_seq) != (kind.KIND, root, seq) or \
            size != len(body) - _HEADER.size:
        raise ShareError(f"share {seq}: kind {got_kind} from rank {got_root} as share "
                         f"{got_seq}, not a {kind.__name__} from rank {root}")
    try:
        return kind.model_validate_json(body[_HEADER.size:], strict=True)
    except (ValidationError, ValueError, RecursionError) as e:
        raise ShareError(f"share {seq}: not a {kind.__name__} "
                         f"({str(e).splitlines()[0][:300]})") from None


def proof_mac(key: bytes, rank: int, nonces: list[str]) -> str:
    """Rank ``rank``'s answer to every rank's challenge (:class:`Hello` nonces), hex."""
    return _mac(key, json.dumps(["proof", rank, nonces]).encode()).hex()


def setup_of(model: Any, config: EngineConfig, level: int) -> Setup:
    """The :class:`Setup` of a :class:`kit.models.resolve.ModelInfo` and a config (its
    secrets blanked: the record travels to other machines)."""
    return Setup(model_id=model.id, model_path=str(model.path),
                 context_window=model.context_window, options=config.for_engine(),
                 log_level=level)
