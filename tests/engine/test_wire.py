"""The engine pipe's encoding (kit/engine/proc/wire.py): every message kind round-trips, and
what is not one of ours (too long, unknown kind, another version, a pickle) is refused
by name, never run."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import pickle
import struct
import threading
from pathlib import Path

import pytest

from kit.config import EngineConfig
from kit.engine.proc import wire
from kit.engine.decode.bridge import END, LoopSink
from kit.engine.interface import SwapResult
from kit.engine.proc.process import EngineProcess, _Link
from kit.engine.types import (
    ChatRequest,
    Finished,
    ReasoningDelta,
    SamplingParams,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCall,
    Usage,
)
from kit.errors import (
    EngineError,
    EngineUnavailable,
    InvalidRequest,
    ModelDoesNotFitError,
    ModelNotFoundError,
)
from kit.models.resolve import InvalidModelSpec, ModelInfo

REQUEST = ChatRequest(
    [{"role": "user", "content": "hé 🙂"}, {"role": "assistant", "content": "",
                                           "tool_calls": [{"id": "c", "function": {}}]}],
    SamplingParams(max_tokens=5, temperature=0.0, logit_bias=((1, 2.5),), stop=("x",),
                   seed=3, logprobs=True, top_logprobs=2),
    tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
    model="m", template_kwargs={"enable_thinking": False}, force_tool="",
    response_schema={"type": "object"}, request_id="req-1")
MODEL = ModelInfo("org/m", Path("/models/m"), 4096)
SNAPSHOT = {
    "model_info": MODEL, "state": "ready", "error": None, "error_type": None,
    "requests_served": 3, "swaps": 0, "reloads": 1, "unloads": 0, "load_seconds": 1.5,
    "phase": None, "memory": {"active_bytes": 10, "peak_bytes": None, "weights_bytes": 4},
    "capabilities": {"tools": True, "reasoning": False, "tool_format": "json",
                     "reasoning_format": None},
    "admission": {"clamped": 0, "ceiling": 2.5, "caches": [{"tokens": 3}]},
    "prompt_cache": {"hits": 1, "misses": 2}, "kv_cache": {"bits": None, "layers": 4}}

MESSAGES = [
    ("gen", 1, REQUEST), ("cancel", 1), ("swap", 2, "org/other"), ("count", 3, REQUEST),
    ("memory", 4, None), ("stop",),
    ("init", MODEL, EngineConfig(prompt_cache_size=2, ttl=60.0, api_key="sekret"), 20),
    ("ev", 1, Started("org/m", 12, 4, 5, 8)),
    ("ev", 1, TextDelta("Hi", (TokenLogprob("Hi", -0.25, (("Hi", -0.25), ("Ho", -2.0))),))),
    ("ev", 1, TextDelta("x", (TokenLogprob("x", 0.0, (("y", float("-inf")),)),))),  # masked
    ("ev", 1, ReasoningDelta("hmm")), ("ev", 1, ToolCall("call_1", "f", '{"a": 1}', 0)),
    ("ev", 1, Finished("stop", Usage(12, 3, 4, 1, 2, 3), "org/m", 0.5, 31.0, "x")),
    ("ev", 1, wire.WIRE_END),
    ("reply", 2, SwapResult("org/other", "org/m", 2.0, True), None),
    ("reply", 3, 42, None), ("reply", 4, {"active_bytes": 1, "peak_bytes": None}, None),
    ("state", SNAPSHOT),
    ("state", {**SNAPSHOT, "distributed": {"world_size": 2, "ranks": [{"rank": 0}]}}),
]


def frame(kind: int, payload: bytes, version: int = wire.VERSION, ident: int = 7) -> bytes:
    return struct.pack(">3sBBQ", wire.MAGIC, version, kind, ident) + payload


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m[0])
def test_every_message_kind_round_trips(message):
    got = wire.decode(wire.encode(message))
    if message[0] == "init":  # the config comes back whole, less its secret
        assert got[:2] == message[:2] and got[3] == message[3]
        assert got[2] == message[2].for_engine() and got[2].api_key is None
        assert got[2].prompt_cache_size == 2 and got[2].ttl == 60.0
    else:
        assert got == message


def test_end_itself_crosses_as_the_end_marker():
    assert wire.decode(wire.encode(("ev", 5, END))) == ("ev", 5, wire.WIRE_END)


@pytest.mark.parametrize("error", [
    InvalidRequest("prompt too long", code="context_length_exceeded", field="messages"),
    ModelDoesNotFitError("does not fit", "use a smaller model", needed=10, budget=5),
    ModelNotFoundError("org/x", ["org/m", "org/n"]),
    EngineUnavailable("the engine is restarting"),
    InvalidModelSpec("not a model", hint="name a folder"),
], ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("tag", ["ev", "reply"])
def test_an_allowed_error_round_trips_with_its_hint_and_fields(error, tag):
    message = ("ev", 9, error) if tag == "ev" else ("reply", 9, None, error)
    got = wire.decode(wire.encode(message))
    back = got[2] if tag == "ev" else got[3]
    assert type(back) is type(error)
    assert str(back) == str(error) and back.message == error.message
    assert back.hint == error.hint
    assert {k: v for k, v in vars(back).items()} == vars(error)


def test_another_exception_type_crosses_as_an_engine_error_naming_its_class():
    class Odd(EngineError):  # a subclass kit does not allow-list
        pass

    for error in (RuntimeError("metal: out of memory"), Odd("odd")):
        back = wire.decode(wire.encode(("ev", 1, error)))[2]
        assert type(back) is EngineError
        assert str(back) == f"{type(error).__name__}: {error}"


def test_an_error_record_naming_an_allowed_class_cannot_smuggle_fields():
    payload = json.dumps({"error": {"type": "InvalidRequest", "message": "m",
                                    "__class__": "os.system"}}).encode()
    with pytest.raises(wire.WireError) as e:
        wire.decode(frame(wire.ErrorEv.KIND, payload))
    assert (e.value.ident, e.value.stream) == (7, "ev")


@pytest.mark.parametrize("bad, stream", [
    (frame(99, b"{}"), None),  # an unknown kind
    (frame(wire.TextEv.KIND, b'{"event":{"text":"x"}}', version=2), None),  # another version
    (b"MK", None),  # too short
    (b"XYZ" + frame(wire.TextEv.KIND, b"{}")[3:], None),  # another magic
    (frame(wire.TextEv.KIND, b'{"event":{"text":1}}'), "ev"),  # not the schema
    (frame(wire.TextEv.KIND, b'{"event":{"text":"x","extra":1}}'), "ev"),  # extra field
    (frame(wire.CountReply.KIND, b'{"tokens":-1}'), "reply"),  # out of range
    (frame(wire.CountReply.KIND, b'{"tokens":"5"}'), "reply"),  # strict: no coercion
    (frame(wire.CountReply.KIND, b'{"tokens": 1' + b" " * 300 + b"}"), "reply"),  # too long
    (frame(wire.State.KIND, b"[" * 100_000 + b"]" * 100_000), "state"),  # too deep
    (frame(wire.Gen.KIND, b"\xff\xfe"), "ev"),  # not JSON
], ids=["unknown-kind", "version", "short", "magic", "schema", "extra", "range", "strict",
        "oversized-kind", "deep", "not-json"])
def test_what_is_not_a_record_of_ours_is_refused_by_name(bad, stream):
    with pytest.raises(wire.WireError) as e:
        wire.decode(bad)
    assert isinstance(e.value, EngineError)
    assert e.value.stream == stream
    assert e.value.ident == (None if stream is None else 7)


class _RunsACommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_on_the_pipe_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    evil = pickle.dumps(("ev", 1, _RunsACommand(marker)))
    a, b = multiprocessing.Pipe()
    try:
        for data in (evil, frame(wire.TextEv.KIND, evil)):
            a.send_bytes(data)
            with pytest.raises(wire.WireError):
                wire.recv(b, wire.TO_SERVER_MAX)
        a.send(("ev", 1, _RunsACommand(marker)))  # Connection.send pickles it
        with pytest.raises(wire.WireError):
            wire.recv(b, wire.TO_ENGINE_MAX)
    finally:
        a.close(), b.close()
    assert not marker.exists()


def test_a_frame_over_the_pipe_bound_is_refused_before_it_is_read():
    a, b = multiprocessing.Pipe()
    try:
        a.send_bytes(wire.encode(("ev", 1, TextDelta("x" * 5000))))
        with pytest.raises(wire.WireError) as e:
            wire.recv(b, 1000)
        assert e.value.ident is None and "bound" in str(e.value)
    finally:
        a.close(), b.close()


def test_a_message_past_its_kind_bound_is_refused_by_its_sender():
    with pytest.raises(wire.WireError):
        wire.encode(("swap", 1, "x" * (wire.SwapTo.MAX_BYTES + 1)))
    with pytest.raises(wire.WireError):
        wire.encode(("ev", 1, object()))


class _Process:
    """What _Link needs of a multiprocessing.Process."""
    exitcode = 0
    pid = 1

    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True

    def join(self, timeout=None) -> None:
        pass


def test_the_server_fails_only_the_request_or_call_a_bad_frame_names():
    """The server's reader (EngineProcess._read): a bad event fails its request, a bad
    reply its call, a bad state report is dropped; a frame not ours fails the rest and
    ends the link."""
    engine = EngineProcess(MODEL)
    server_end, engine_end = multiprocessing.Pipe()
    process = _Process()
    link = _Link(server_end, process)
    loop = asyncio.new_event_loop()
    sinks = {jid: LoopSink(loop, threading.Event()) for jid in (1, 2)}
    link.sinks.update(sinks)
    calls = {cid: concurrent.futures.Future() for cid in (3, 4)}
    link.calls.update(calls)
    reader = threading.Thread(target=engine._read, args=(link,), daemon=True)
    reader.start()
    engine_end.send_bytes(frame(wire.TextEv.KIND, b'{"event":{}}', ident=1))
    engine_end.send_bytes(frame(wire.CountReply.KIND, b'{"tokens":null}', ident=3))
    engine_end.send_bytes(frame(wire.State.KIND, b'{"model":{}}', ident=0))
    engine_end.send_bytes(wire.encode(("ev", 2, TextDelta("fine"))))
    engine_end.send_bytes(b"\x80\x04not ours")
    reader.join(10)
    assert not reader.is_alive() and process.killed and link.closed.is_set()

    async def drain(jid):
        got = []
        try:
            async for event in sinks[jid].drain():
                got.append(event)
        except EngineError as e:
            return got, e
        return got, None
    got1, error1 = loop.run_until_complete(drain(1))
    got2, error2 = loop.run_until_complete(drain(2))
    loop.close()
    assert got1 == [] and isinstance(error1, wire.WireError) and error1.stream == "ev"
    assert got2 == [TextDelta("fine")] and isinstance(error2, wire.WireError)
    assert error2.ident is None  # the frame that was not ours
    assert isinstance(calls[3].exception(), wire.WireError)
    assert calls[3].exception().stream == "reply"
    assert isinstance(calls[4].exception(), wire.WireError)
    assert engine.state == "loading"  # the bad state report changed nothing


class _Engine:
    """What _PipeServer.read_commands needs of an Engine."""
    reclaim_heap = False

    def __init__(self) -> None:
        self.submitted: list = []

    def submit(self, item) -> None:
        self.submitted.append(item)

    def cancel(self, job) -> None:
        pass


def test_the_engine_refuses_a_bad_request_by_name_and_stops_on_a_pickle(tmp_path):
    """The engine's reader (child._PipeServer): a request that does not validate fails
    alone (its error, then its end); a pickle is never run and ends the link as if the
    server were gone (the worker is told to stop)."""
    from kit.engine.proc.child import _PipeServer

    marker = tmp_path / "ran"
    server_end, engine_end = multiprocessing.Pipe()
    pipe = _PipeServer.__new__(_PipeServer)  # no Engine: nothing here loads a model
    pipe._conn, pipe._send_lock, pipe._live, pipe._extra = engine_end, threading.Lock(), {}, None
    pipe.engine = engine = _Engine()
    reader = threading.Thread(target=pipe.read_commands, daemon=True)
    reader.start()
    server_end.send_bytes(frame(wire.Gen.KIND, b'{"request":{"messages":"not a list"}}',
                                ident=5))
    got = [wire.recv(server_end, wire.TO_SERVER_MAX) for _ in range(2)]
    assert got[0][:2] == ("ev", 5) and isinstance(got[0][2], wire.WireError)
    assert "ChatRequest" in str(got[0][2]) or "Gen" in str(got[0][2])
    assert got[1] == ("ev", 5, wire.WIRE_END)
    server_end.send_bytes(wire.encode(("count", 6, REQUEST))[:-1])  # cut: not JSON
    _, cid, result, error = wire.recv(server_end, wire.TO_SERVER_MAX)
    assert (cid, result) == (6, None) and isinstance(error, wire.WireError)
    assert engine.submitted == []
    server_end.send(("gen", 7, _RunsACommand(marker)))  # a pickle, as Connection.send makes
    reader.join(10)
    assert not reader.is_alive() and engine.submitted == [None]
    assert not marker.exists()
    server_end.close(), engine_end.close()
