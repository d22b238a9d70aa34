"""``serve --ranks 3 --kv-bits 8``: every rank builds the same quantized KV cache for its
share of the heads (the settings go to each rank's Engine): every rank decodes the same
text, one request at a time, and the first step's distribution stays near full
precision's as the single process's does (tests/server/test_kv_bits.py). The text itself
is not compared: 8-bit KV moves the logits by more than the starter's near-ties, and the
ranks' sums round differently (tests/greedy.py)."""

from __future__ import annotations

from tests.distributed.conftest import RANK_FLAGS, ready
from tests.distributed.test_equality import rank_texts
from tests.helpers import openai_for, start_server, stop
from tests.server.test_kv_bits import first_step

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_three_ranks_with_kv_bits_8_decode_in_step_near_full_precision(hf_home, tmp_path,
                                                                       server):
    s = ready(start_server(tmp_path, hf_home, "--temperature", "0", "--kv-bits", "8",
                           *RANK_FLAGS))
    try:
        r = openai_for(s).chat.completions.create(model="local", max_tokens=10,
                                                  temperature=0, messages=FRANCE)
        text = r.choices[0].message.content
        assert text.strip() and rank_texts(s, r.id) == {repr(text)}
        full, quantized = first_step(server, FRANCE, 3), first_step(s, FRANCE, 10)
        for token, logprob in full.items():  # the bound tests/server/test_kv_bits.py uses
            assert token in quantized and abs(quantized[token] - logprob) < 0.5, (
                token, full, quantized)
        health = s.health()
        assert health["kv_cache"]["bits"] == 8 and health["kv_cache"]["max_batch"] == 1
        assert health["distributed"]["world_size"] == 3
    finally:
        stop(s)
