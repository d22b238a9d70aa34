"""``serve --kv-bits 8|4``: a real server on the starter with its KV cache quantized
(mlx-lm's ``QuantizedKVCache`` from the first token) answers on chat completions and
Messages, agrees with the full-precision server on a fixed greedy prompt, keeps using the
prompt cache, serves concurrent requests one at a time, and says so on /health; the
flags it refuses are refused before anything loads; ``fit`` shows the larger window."""

from __future__ import annotations

import concurrent.futures
import re

import pytest

from tests.helpers import (anthropic_for, openai_for, run_kit, spawn_server, start_server,
                           stop, wait_until)

STARTER = "mlx-kit/SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PARIS = "The capital of France is Paris."


@pytest.fixture(scope="module")
def kv8(hf_home, tmp_path_factory):
    """A greedy server with ``--kv-bits 8`` and one prompt cache entry (so one unrelated
    request makes the next one cold again)."""
    s = start_server(tmp_path_factory.mktemp("home-kv8"), hf_home, "--kv-bits", "8",
                     "--temperature", "0", "--prompt-cache-size", "1")
    yield s
    stop(s)


def chat(server, messages, max_tokens=12):
    """(text, usage) of one greedy chat completion through the OpenAI SDK."""
    r = openai_for(server).chat.completions.create(model="local", messages=messages,
                                                   max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content, r.usage


def test_kv_bits_8_answers_chat_and_messages_and_health_shows_it(kv8):
    text, usage = chat(kv8, FRANCE)
    assert text == PARIS and usage.completion_tokens == 8
    m = anthropic_for(kv8).messages.create(model="local", max_tokens=12, messages=FRANCE)
    assert m.content[0].text == PARIS and m.stop_reason == "end_turn"
    kv = kv8.health()["kv_cache"]
    # every one of the starter's 30 layers is a plain KVCache, so all are quantized
    assert kv == {"bits": 8, "group_size": 64, "quantized_start": 0, "quantized_layers": 30,
                  "layers": 30, "max_batch": 1}
    assert "--kv-bits 8: requests decode one at a time (max batch 1)" in kv8.log_text()


def test_kv_bits_8_greedy_text_agrees_with_full_precision(kv8, server):
    # Measured on the starter (f32 activations, 8 bits in groups of 64): France's answer
    # is the same to its EOS (8 tokens), "What is 2+2?" too (12 tokens); "Name a color."
    # leaves the full-precision text after ~12 tokens, "List three prime numbers." after
    # ~7 (bench/kv_bits.py has the mean over a prompt set). So the whole short answers
    # that held are asserted, not a long generation.
    for messages in (FRANCE, [{"role": "user", "content": "What is 2+2?"}]):
        quantized, _ = chat(kv8, messages, max_tokens=16)
        full, _ = chat(server, messages, max_tokens=16)
        assert quantized == full
    assert quantized == "The answer to this classic math problem is 4."


def test_prompt_cache_with_quantized_kv_second_turn_is_cached_and_same_as_cold(kv8):
    system = {"role": "system", "content": "You answer in one short sentence. Session kv-1."}
    turn1 = [system, {"role": "user", "content": "What is the capital of Italy?"}]
    first, u1 = chat(kv8, turn1)
    turn2 = turn1 + [{"role": "assistant", "content": first},
                     {"role": "user", "content": "And of Spain?"}]
    warm, u2 = chat(kv8, turn2)
    # the next-turn prefill left turn 1 and its answer in the (quantized) cache
    assert u2.prompt_tokens_details.cached_tokens >= u1.prompt_tokens + u1.completion_tokens
    # an unrelated conversation takes the one cache entry: turn 2 is cold again
    chat(kv8, [{"role": "system", "content": "Other."}, {"role": "user", "content": "Hi"}],
         max_tokens=2)
    cold, u3 = chat(kv8, turn2)
    assert u3.prompt_tokens_details.cached_tokens < 20  # at most the template's opening
    assert warm == cold and warm


def test_concurrent_requests_with_kv_bits_all_answer_one_at_a_time(kv8):
    prompts = ["Name a color.", "What is 2+2?", "Say hello."]
    alone = [chat(kv8, [{"role": "user", "content": p}], max_tokens=6)[0] for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: chat(kv8, [{"role": "user", "content": p}],
                                                max_tokens=6)[0], prompts))
    assert together == alone and all(together)
    assert "joins a batch" not in kv8.log_text()  # max batch 1: never batched
    assert kv8.health()["kv_cache"]["max_batch"] == 1


def test_kv_bits_4_answers_chat_and_messages(hf_home, tmp_path):
    s = start_server(tmp_path, hf_home, "--kv-bits", "4", "--kv-group-size", "32",
                     "--temperature", "0")
    try:
        text, usage = chat(s, FRANCE)
        assert text and usage.completion_tokens > 0
        m = anthropic_for(s).messages.create(model="local", max_tokens=8, messages=FRANCE)
        assert m.content[0].text and m.usage.output_tokens > 0
        kv = s.health()["kv_cache"]
        assert (kv["bits"], kv["group_size"], kv["quantized_layers"]) == (4, 32, 30)
    finally:
        stop(s)


def test_kv_group_size_that_does_not_divide_the_head_is_refused_at_load(hf_home, tmp_path):
    # the starter's heads have 64 values: groups of 128 cannot split them; the load fails
    # with the flags named (a ModelError on /health and on requests), not a traceback
    s = spawn_server(tmp_path, hf_home, "--kv-bits", "8", "--kv-group-size", "128")
    try:
        health = wait_until(lambda: (h := s.health())["model_state"] == "failed" and h,
                            timeout=120, what="the load failing")
        assert "--kv-bits 8 --kv-group-size 128" in health["error"]
        assert "cannot run with a quantized KV cache" in health["error"]
    finally:
        stop(s)


@pytest.mark.parametrize("args, words", [
    (("--kv-bits", "4", "--max-batch", "4"), ["--kv-bits 4", "--max-batch 4"]),
    (("--kv-bits", "3"), ["--kv-bits 3 is not supported"]),
    (("--kv-bits", "8", "--kv-group-size", "48"), ["--kv-group-size 48 is not supported"]),
])
def test_serve_refuses_kv_settings_it_cannot_run_naming_the_flags(tmp_path, args, words):
    r = run_kit(tmp_path, "serve", "--port", "1", *args, timeout=60)
    assert r.returncode == 1
    assert all(w in r.stderr for w in words), r.stderr
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def _window_rows(stdout: str) -> dict[str, int]:
    """``fit``'s table: KV setting -> tokens that fit."""
    rows = re.findall(r"^  (full precision|--kv-bits \d)\s+[\d.]+ [KMG]?i?B\s+(\d+)", stdout,
                      re.M)
    return {name: int(tokens) for name, tokens in rows}


def test_fit_kv_bits_4_shows_the_larger_window(hf_home, tmp_path):
    r = run_kit(tmp_path, "fit", STARTER, "--kv-bits", "4", "--ctx", "4096", hf_home=hf_home)
    assert r.returncode == 0, r.stderr
    # 30 layers x 3 KV heads x (K, V) x (64 values at 4 bits + 1 f32 scale and bias per
    # group of 64) = 7200 bytes a token, against 46080 at full precision (f32)
    assert "KV cache: 28.12 MiB (4-bit: 7200 bytes/token x 4096 tokens)" in r.stdout
    rows = _window_rows(r.stdout)
    assert list(rows) == ["full precision", "--kv-bits 8", "--kv-bits 4"]
    assert rows["--kv-bits 4"] > rows["--kv-bits 8"] > rows["full precision"] > 0
    # the same room divided by bytes a token (46080 / 7200 = 6.4)
    assert rows["--kv-bits 4"] / rows["full precision"] == pytest.approx(6.4, rel=0.01)
