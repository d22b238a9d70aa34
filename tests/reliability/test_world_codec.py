"""Issue 25, finding 1: what the ranks share is typed, bounded, authenticated frames
(kit/engine/distributed/world_codec.py), never pickles. Model-free: every record kind round-trips;
an altered byte, a replayed or reordered share, another kind or rank, another version,
a payload past its bound, a pickle and a key that is not the world's are each refused
with a ShareError (which the world turns into WorldTampered, naming the link)."""

from __future__ import annotations

import os
import pickle
import socket
import struct
from pathlib import Path

import pytest


from kit.config import EngineConfig
from kit.engine.distributed import world_codec as codec
from kit.engine.distributed.ring_guard import KeyMissing, foreign_peers, read_world_key, socket_owners
from kit.engine.types import ChatRequest, SamplingParams
from kit.engine.distributed.world_codec import (
    Alike,
    Arrivals,
    Fault,
    Gen,
    Hello,
    Machine,
    Proof,
    RankFacts,
    Seed,
    Setup,
    ShareError,
    Stop,
    SwapTo,
)
from kit.engine.distributed.world_faults import error_of, fault_of
from kit.errors import InvalidRequest, ModelDoesNotFitError, ModelError
from kit.models.resolve import ModelInfo

KEY = os.urandom(32)


def _request() -> ChatRequest:
    return ChatRequest(
        messages=[{"role": "user", "content": "Capital of France?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
                  {"role": "tool", "content": "Paris", "tool_call_id": "c1"}],
        params=SamplingParams(max_tokens=7, temperature=0.0, logit_bias=((5, -1.5),),
                              stop=("\n\n",), seed=11, logprobs=True, top_logprobs=2),
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        template_kwargs={"enable_thinking": False}, force_tool="", request_id="r1",
        response_schema={"type": "object"})


def _setup() -> Setup:
    info = ModelInfo("org/model", Path("/models/model"), 8192)
    return codec.setup_of(info, EngineConfig(prompt_cache_size=4, ttl=30, max_batch=1,
                                             prompt_cache_dir="/tmp/c", kv_bits=8,
                                             api_key="sekret"), 20)


EVERY_KIND = [
    _setup(),
    Seed(value=2**32 - 1),
    Hello(nonce="ab" * 32),
    Proof(mac="cd" * 32),
    fault_of(InvalidRequest("too long", code="context_length_exceeded", field="max_tokens"),
             "host-a"),
    Alike(mlx="0.32.4", mlx_lm="0.32.2", kit="0.1", device="Device(cpu, 0)", prefill=2048),
    Machine(host="host-a", node=2**48 - 1),
    RankFacts(rank=2, host="127.0.0.1", hostname="h", pid=123,
              memory={"active_bytes": 5, "peak_bytes": None}),
    Arrivals(items=[Gen(jid=3, request=_request()), SwapTo(spec="other"), Stop()],
             cancels=[1, 2], timed_out=True),
]


def test_every_record_kind_crosses_unchanged():
    assert {type(r) for r in EVERY_KIND} == set(codec.KINDS.values())
    for seq, record in enumerate(EVERY_KIND):
        frame = codec.encode(KEY, seq, 1, record)
        assert codec.decode(KEY, seq, 1, type(record), frame) == record
    request = codec.decode(KEY, 0, 0, Arrivals,
                           codec.encode(KEY, 0, 0, EVERY_KIND[-1])).items[0].request
    assert isinstance(request, ChatRequest) and request == _request()
    assert isinstance(request.params, SamplingParams)
    setup = EVERY_KIND[0]
    assert setup.options.prompt_cache_dir == "/tmp/c" and setup.options.ttl == 30


def test_an_altered_byte_anywhere_in_a_frame_fails_its_mac():
    frame = codec.encode(KEY, 4, 0, EVERY_KIND[-1])
    for at in (0, 5, 9, 20, len(frame) // 2, len(frame) - 1):
        bad = bytearray(frame)
        bad[at] ^= 0x01
        with pytest.raises(ShareError):
            codec.decode(KEY, 4, 0, Arrivals, bytes(bad))


def test_a_replayed_or_reordered_share_is_refused():
    frame = codec.encode(KEY, 4, 0, Seed(value=1))
    with pytest.raises(ShareError, match="as share 4"):  # a replay: its seq is not ours
        codec.decode(KEY, 5, 0, Seed, frame)
    tag = codec.length_tag(KEY, 4, 0, len(frame))
    codec.check_length(KEY, 4, 0, len(frame), tag, Seed)
    for seq, root, size in ((5, 0, len(frame)), (4, 1, len(frame)), (4, 0, 0)):
        with pytest.raises(ShareError, match="MAC"):
            codec.check_length(KEY, seq, root, size, tag, Seed)


def test_another_kind_or_rank_under_the_right_key_is_refused():
    frame = codec.encode(KEY, 0, 0, Seed(value=1))
    with pytest.raises(ShareError):
        codec.decode(KEY, 0, 0, Hello, frame)
    with pytest.raises(ShareError):
        codec.decode(KEY, 0, 1, Seed, frame)


def test_another_version_is_refused_even_under_the_right_key():
    payload = Seed(value=1).model_dump_json().encode()
    header = struct.pack(">4sBBBxQI", codec.MAGIC, codec.VERSION + 1, Seed.KIND, 0, 0,
                         len(payload))
    frame = header + payload + codec._mac(KEY, header + payload)
    with pytest.raises(ShareError, match="version"):
        codec.decode(KEY, 0, 0, Seed, frame)


def test_a_pickle_is_never_run_even_with_a_valid_mac(tmp_path):
    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps(Boom())
    header = struct.pack(">4sBBBxQI", codec.MAGIC, codec.VERSION, Arrivals.KIND, 0, 0,
                         len(payload))
    forged = header + payload + codec._mac(KEY, header + payload)  # the key leaked, even
    with pytest.raises(ShareError, match="not a Arrivals|not an? "):
        codec.decode(KEY, 0, 0, Arrivals, forged)
    with pytest.raises(ShareError, match="MAC"):  # and without the key: refused first
        codec.decode(os.urandom(32), 0, 0, Arrivals, forged)
    assert not marker.exists()


def test_bounds_are_checked_before_a_frame_is_allocated_or_parsed():
    big = Fault(kind="model", message="x" * (64 << 10), host="h")
    with pytest.raises(Exception):  # the record itself refuses past its fields' bounds
        Fault(kind="model", message="x" * ((64 << 10) + 1), host="h")
    codec.encode(KEY, 0, 0, big)
    size = codec.max_frame_bytes(Seed) + 1
    with pytest.raises(ShareError, match="bound"):
        codec.check_length(KEY, 0, 0, size, codec.length_tag(KEY, 0, 0, size), Seed)
    with pytest.raises(ShareError):
        codec.decode(KEY, 0, 0, Seed, b"\0" * size)
    with pytest.raises(ShareError):
        codec.decode(KEY, 0, 0, Seed, b"short")


def test_fields_outside_the_schema_are_refused():
    for payload in (b'{"value": 1, "extra": 2}', b'{"value": "1"}', b'{"value": -1}',
                    b'[' * 10000, b'\xff'):
        header = struct.pack(">4sBBBxQI", codec.MAGIC, codec.VERSION, Seed.KIND, 0, 0,
                             len(payload))
        frame = header + payload + codec._mac(KEY, header + payload)
        with pytest.raises(ShareError, match="not a Seed"):
            codec.decode(KEY, 0, 0, Seed, frame)
    with pytest.raises(Exception):
        EngineConfig.model_validate({"unknown": 1})


def test_a_ranks_error_keeps_its_kind_fields_and_names_the_rank():
    e = error_of(fault_of(ModelDoesNotFitError("too big", "use a smaller one", needed=9,
                                               budget=3), "host-b"), 2)
    assert isinstance(e, ModelDoesNotFitError) and (e.needed, e.budget) == (9, 3)
    assert e.message == "rank 2 (host-b): too big" and e.hint == "use a smaller one"
    e = error_of(fault_of(InvalidRequest("bad", code="c", field="top_k"), "h"), 1)
    assert isinstance(e, InvalidRequest) and (e.code, e.field) == ("c", "top_k")
    e = error_of(fault_of(ValueError("no shard"), "h"), 1)
    assert type(e) is ModelError and e.message == "rank 1 (h): no shard"
    forged = Fault(kind="system_exit", message="m", host="h")  # not one of our kinds
    assert type(error_of(forged, 1)) is ModelError


def test_the_world_secret_comes_from_the_environment_or_one_stdin_line():
    env = {codec.KEY_ENV: KEY.hex()}
    assert read_world_key(env) == KEY and codec.KEY_ENV not in env
    r, w = os.pipe()
    os.write(w, KEY.hex().encode() + b"\n")
    assert read_world_key({}, stdin=r) == KEY
    os.write(w, b"not hex\n")
    with pytest.raises(KeyMissing):
        read_world_key({}, stdin=r)
    os.close(w)
    with pytest.raises(KeyMissing):  # end of file: no line
        read_world_key({}, stdin=r)
    os.close(r)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux /proc only")
def test_a_loopback_link_to_this_users_socket_passes_and_another_uid_is_named():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            pair = (client.getsockname(), client.getpeername())
            owners = socket_owners()
            assert owners is not None
            assert foreign_peers([pair], owners, os.getuid()) == []
            assert foreign_peers([pair], owners, os.getuid() + 1) == [(pair[1], os.getuid())]
            far = ((pair[0][0], pair[0][1]), ("10.255.255.1", 9))  # another host: unknown
            assert foreign_peers([far], owners, os.getuid() + 1) == []


def test_ring_ports_are_drawn_at_random_below_the_ephemeral_range(tmp_path, monkeypatch):
    from kit.engine.distributed.hosts import _ring_range, free_ring_ports
    from kit.engine.distributed.ring_guard import ring_ports

    low, high = _ring_range()
    firsts = {free_ring_ports(3) for _ in range(8)}
    assert len(firsts) > 4 and all(low <= p and p + 3 <= high for p in firsts)
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('[["127.0.0.1:20000"], ["127.0.0.1:20001"], ["127.0.0.1:20002"]]')
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    assert ring_ports() == {20000: 0, 20001: 1, 20002: 2}
    hostfile.write_text("[[")
    assert ring_ports() == {}
