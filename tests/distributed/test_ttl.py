"""``--ttl`` across ranks: a 3-rank server (``serve --ranks 3 --ttl 2``) unloads its model
on every rank when idle (rank 0 decides the timeout and shares it), and the next request
reloads it on every rank and answers as before (the single process's answer:
tests/distributed/test_equality.py checks it is the same)."""

from __future__ import annotations

import re

import pytest

from tests.distributed.conftest import COMMON, RANK_FLAGS
from tests.distributed.test_equality import FRANCE, MAX_TOKENS, PARIS, chat, rank_texts
from tests.greedy import assert_agrees
from tests.helpers import openai_for, start_server, stop, wait_until

WORLD = 3


@pytest.fixture(scope="module")
def ttl_server(hf_home, tmp_path_factory):
    """``serve --ranks 3 --ttl 2``; returned at once (its model may be loading)."""
    s = start_server(tmp_path_factory.mktemp("home-ttl"), hf_home, *COMMON, *RANK_FLAGS,
                     "--ttl", "2")
    yield s
    stop(s)


def ranks_memory(server) -> list[dict]:
    return [r["memory"] for r in server.health()["distributed"]["ranks"]]


def test_ttl_unloads_every_rank_and_the_next_request_reloads_and_answers_the_same(ttl_server,
                                                                                 server):
    s = ttl_server
    # loaded, then 2 s idle: unloaded (the wait covers the ranks' load, ~15-30 s here)
    wait_until(lambda: s.health()["model_state"] == "unloaded", 240, every=0.2,
               what="the model being unloaded after --ttl 2")
    h = s.health()
    assert h["status"] == "ok" and h["unloads"] >= 1 and h["reloads"] == 0
    assert h["load_seconds"] is not None  # it did load first
    # every rank let its shard go, not only rank 0
    wait_until(lambda: all(m["weights_bytes"] == 0 for m in ranks_memory(s)), 30,
               what="every rank reporting no weights")
    for m in ranks_memory(s):
        assert m["active_bytes"] < 60e6, m  # a shard of the f32 starter is ~255 MB

    france = [{"role": "user", "content": FRANCE}]
    answer = chat(openai_for(s), france, False)
    # the single process's answer, up to a near-tie (the ranks add in another order)
    assert_agrees(server, france, PARIS, answer.text, max_tokens=MAX_TOKENS)
    assert rank_texts(s, answer.id) == {repr(answer.text)}  # every rank decoded it
    h = s.health()
    assert h["reloads"] == 1 and h["status"] == "ok"
    reloaded = set(re.findall(r" rank (\d+) \[[^\]]*\] mlx_kit\.engine: reloaded ", s.log_text()))
    assert reloaded == {str(r) for r in range(WORLD)}
