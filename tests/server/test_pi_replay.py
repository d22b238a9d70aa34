"""A replay of pi's real request sequence (recorded from pi 0.73.1: its ~2.3 KB system
prompt, 4 tools, streaming with include_usage) over 3 turns: turns 2 and 3 reuse the
prompt cache (cached_tokens > 0) and reach their first token sooner than turn 1."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import httpx


RECORDED = json.loads((Path(__file__).parent.parent / "data" / "pi-0.73.1-request.json").read_text())


def stream_turn(server, body: dict) -> tuple[float, str, dict]:
    """(seconds to the first content token, answer text, usage) of one streamed turn."""
    t0 = time.perf_counter()
    ttft, text, usage = None, "", {}
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                if c["delta"].get("content"):
                    ttft = ttft or time.perf_counter() - t0
                    text += c["delta"]["content"]
    return ttft, text, usage


def test_pi_replay_reuses_the_prompt_cache(server):
    assert {t["function"]["name"] for t in RECORDED["tools"]} == {"read", "bash", "edit", "write"}
    body = copy.deepcopy(RECORDED)
    body["max_completion_tokens"] = 24
    body["messages"][0]["content"] += "\nReplay id: " + str(time.time())  # a cold prefix
    turns = ["What is the capital of France?", "And of Spain?", "And of Italy?"]
    results = []
    for i, question in enumerate(turns):
        if i:
            body["messages"].append({"role": "assistant", "content": results[-1][1]})
            body["messages"].append({"role": "user", "content": [{"type": "text", "text": question}]})
        results.append(stream_turn(server, body))
    (t1, _, u1), (t2, _, u2), (t3, _, u3) = results
    assert u1["prompt_tokens"] > 400
    assert u1["prompt_tokens_details"]["cached_tokens"] < 20  # at most the template opening
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"] - 1
    assert u3["prompt_tokens_details"]["cached_tokens"] >= u2["prompt_tokens"] - 1
    assert t2 < t1 and t3 < t1
