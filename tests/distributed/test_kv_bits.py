"""``serve --ranks 3 --kv-bits 8``: every rank builds the same quantized KV cache for its
share of the heads (the settings go to each rank's Engine), so the 3-rank server answers
the single-process ``--kv-bits 8`` text (tests/server/test_kv_bits.py asserts that one:
Paris, to the EOS), one request at a time."""

from __future__ import annotations

from tests.distributed.conftest import RANK_FLAGS, ready
from tests.helpers import openai_for, start_server, stop

PARIS = "The capital of France is Paris."


def test_three_ranks_with_kv_bits_8_answer_the_single_process_text(hf_home, tmp_path):
    s = ready(start_server(tmp_path, hf_home, "--temperature", "0", "--kv-bits", "8",
                           *RANK_FLAGS))
    try:
        r = openai_for(s).chat.completions.create(
            model="local", max_tokens=10, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert r.choices[0].message.content == PARIS
        health = s.health()
        assert health["kv_cache"]["bits"] == 8 and health["kv_cache"]["max_batch"] == 1
        assert health["distributed"]["world_size"] == 3
    finally:
        stop(s)
