"""One 3-rank world started with two engine options at once (``serve --ranks 3 --kv-bits 8
--kv-group-size 32 --ttl 3``: one world instead of two, each option's checks in a test of
its own).

- ``--kv-bits 8``: every rank builds the same quantized KV cache for its share of the
  heads (the settings go to each rank's Engine): every rank decodes the same text, one
  request at a time, and the first step's distribution stays near full precision's (one
  process, no KV quantization) as the single process's does (tests/server/test_kv_bits.py).
  The text itself is not compared with one process: 8-bit KV moves the logits by more than
  near-ties, and the ranks' sums round differently (tests/greedy.py).
- ``--ttl``: the world unloads its model on every rank when idle (rank 0 decides the
  timeout and shares it), and the next request reloads it on every rank and answers what
  the world answered before it unloaded (the same world: the same numerics).

Both run the decisive tiny model (tests/distributed/conftest.py), ~100x the starter's
speed on a world."""

from __future__ import annotations

import re

import pytest

from tests.distributed.conftest import RANK_FLAGS, ready
from tests.distributed.test_equality import rank_texts
from tests.helpers import openai_for, start_server, stop, wait_until
from tests.server.test_kv_bits import first_step

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
WORLD = 3
TTL_S = 3


@pytest.fixture(scope="module")
def world(hf_home, world_model, tmp_path_factory):
    """``serve --ranks 3 --kv-bits 8 --kv-group-size 32 --ttl 3``, its model loaded."""
    s = ready(start_server(tmp_path_factory.mktemp("home-kv8-ttl"), hf_home,
                           "--model", str(world_model), "--temperature", "0",
                           "--kv-bits", "8", "--kv-group-size", "32",  # its head_dim
                           "--ttl", str(TTL_S), *RANK_FLAGS))
    yield s
    stop(s)


def ask(server) -> tuple[str, str]:
    r = openai_for(server).chat.completions.create(model="local", max_tokens=10,
                                                   temperature=0, messages=FRANCE)
    return r.choices[0].message.content, r.id


def ranks_memory(server) -> list[dict]:
    return [r["memory"] for r in server.health()["distributed"]["ranks"]]


def test_three_ranks_with_kv_bits_8_decode_in_step_near_full_precision(world, single_server):
    text, rid = ask(world)
    assert text.strip() and rank_texts(world, rid) == {repr(text)}
    full, quantized = first_step(single_server, FRANCE, 3), first_step(world, FRANCE, 10)
    for token, logprob in full.items():  # the bound tests/server/test_kv_bits.py uses
        assert token in quantized and abs(quantized[token] - logprob) < 0.5, (
            token, full, quantized)
    health = world.health()
    assert health["kv_cache"]["bits"] == 8 and health["kv_cache"]["max_batch"] == 1
    assert health["distributed"]["world_size"] == 3


def test_ttl_unloads_every_rank_and_the_next_request_reloads_and_answers_the_same(world):
    before, _ = ask(world)  # loaded (again, if it unloaded since)
    reloads = world.health()["reloads"]
    loaded = [m["active_bytes"] for m in ranks_memory(world)]
    wait_until(lambda: world.health()["model_state"] == "unloaded", 60, every=0.2,
               what=f"the model being unloaded after --ttl {TTL_S}")
    h = world.health()
    assert h["status"] == "ok" and h["unloads"] >= 1 and h["load_seconds"] is not None
    # every rank let its shard go, not only rank 0
    wait_until(lambda: all(m["weights_bytes"] == 0 for m in ranks_memory(world)), 30,
               what="every rank reporting no weights")
    for m, was in zip(ranks_memory(world), loaded):
        assert m["active_bytes"] < was / 2, (m, was)  # a shard is ~38 MB

    text, rid = ask(world)
    assert text == before  # the world's own answer: the same numerics as before
    assert rank_texts(world, rid) == {repr(text)}  # every rank decoded it
    h = world.health()
    assert h["reloads"] == reloads + 1 and h["status"] == "ok"
    reloaded = re.findall(r" rank (\d+) \[[^\]]*\] mlx_kit\.engine: reloaded ",
                          world.log_text())
    assert set(reloaded) == {str(r) for r in range(WORLD)}
