"""The prompt-cache policy and the thread->loop bridge on their own: no model, no
batching. Real mlx-lm KV caches (``KVCache``) with made-up keys/values stand in for a
model's layers: the policy only counts, trims and copies them."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kit.engine.decode.bridge import END, LoopSink, merge
from kit.engine.cache.policy import PromptCachePolicy, reusable_prefix
from kit.engine.types import ReasoningDelta, TextDelta, TokenLogprob, ToolCall


def _cache(n_tokens: int, layers: int = 2) -> list:
    """A per-layer KV cache holding ``n_tokens`` positions."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    cache = [KVCache() for _ in range(layers)]
    kv = mx.zeros((1, 2, n_tokens, 4))
    for c in cache:
        c.update_and_fetch(kv, kv)
    return cache


def _held(cache: list) -> int:
    return cache[0].offset


# -- PromptCachePolicy ---------------------------------------------------------------------

def test_a_miss_starts_from_a_new_cache_and_prefills_the_whole_prompt():
    policy = PromptCachePolicy(size=4)
    made = []
    cache, rest = policy.fetch("m", [1, 2, 3], lambda: made.append(1) or _cache(0))
    assert made == [1] and rest == [1, 2, 3] and _held(cache) == 0


def test_an_exact_hit_refeeds_the_last_prompt_token_for_fresh_logits():
    policy = PromptCachePolicy(size=4)
    policy.insert("m", [1, 2, 3, 4], _cache(4))
    cache, rest = policy.fetch("m", [1, 2, 3, 4], lambda: pytest.fail("no new cache"))
    assert rest == [4] and _held(cache) == 3


def test_a_longer_prompt_continues_from_the_cached_prefix_and_the_stored_cache_is_a_copy():
    policy = PromptCachePolicy(size=4)
    stored = _cache(3)
    policy.insert("m", [1, 2, 3], stored)
    cache, rest = policy.fetch("m", [1, 2, 3, 9, 9], lambda: _cache(0))
    assert rest == [9, 9] and _held(cache) == 3 and cache is not stored
    cache[0].trim(3)  # what generation does to its copy stays out of the stored one
    again, rest = policy.fetch("m", [1, 2, 3, 7], lambda: _cache(0))
    assert rest == [7] and _held(again) == 3


def test_caches_are_per_model_and_cleared_with_it():
    policy = PromptCachePolicy(size=4)
    policy.insert("a", [1, 2, 3], _cache(3))
    _, rest = policy.fetch("b", [1, 2, 3], lambda: _cache(0))
    assert rest == [1, 2, 3]
    policy.clear()
    _, rest = policy.fetch("a", [1, 2, 3], lambda: _cache(0))
    assert rest == [1, 2, 3]


def test_next_turn_trims_to_the_common_prefix_and_prefills_the_re_rendered_rest():
    # prompt 1..4, generated 5 6 EOS(99); the next turn resends 1..6 then end-of-turn 50
    policy = PromptCachePolicy(size=4)
    tokens, resend = [1, 2, 3, 4, 5, 6, 99], [1, 2, 3, 4, 5, 6, 50, 51]
    cache = _cache(len(tokens))
    prefilled = []

    def prefill(c, rest):
        prefilled.append(list(rest))
        for layer in c:  # what the model's forward pass does to the cache
            import mlx.core as mx

            kv = mx.zeros((1, 2, len(rest), 4))
            layer.update_and_fetch(kv, kv)

    kept = policy.next_turn(tokens, resend, n_prompt=4, cache=cache, prefill=prefill)
    assert kept == resend and prefilled == [[50, 51]] and _held(cache) == len(resend)


def test_next_turn_without_a_prefill_trims_to_a_prefix_the_next_prompt_replaces():
    # a batch row done while others decode: trimmed, the rest left to the next turn
    policy = PromptCachePolicy(size=4)
    tokens, resend = [1, 2, 3, 4, 5, 6, 99], [1, 2, 3, 4, 5, 6, 50, 51]
    cache = _cache(len(tokens))
    kept = policy.next_turn(tokens, resend, n_prompt=4, cache=cache, prefill=None)
    assert kept == [1, 2, 3, 4, 5, 6] and _held(cache) == 6
    policy.insert("m", kept, cache)
    got, rest = policy.fetch("m", resend + [7, 8], lambda: _cache(0))
    assert rest == [50, 51, 7, 8] and _held(got) == 6  # the next turn starts from it
    policy.insert("m", resend + [7, 8], _cache(len(resend) + 2))
    assert policy.entries() == 1  # and its own cache replaced the prefix


@pytest.mark.parametrize("resend, tokens, n_prompt, expected", [
    ([1, 2, 3], [1, 2, 3, 4], 2, None),  # the cache already starts with all of it
    ([1, 9, 9, 9, 9], [1, 2, 3, 4, 5], 4, None),  # the template rewrote the prompt
    ([1, 2, 3, 7], [1, 2, 3, 4, 5], 3, 3),  # keep 3, re-render from there
])
def test_reusable_prefix(resend, tokens, n_prompt, expected):
    assert reusable_prefix(resend, tokens, n_prompt) == expected


def test_next_turn_leaves_a_cache_alone_when_nothing_is_gained():
    policy = PromptCachePolicy(size=4)
    cache = _cache(4)
    kept = policy.next_turn([1, 2, 3, 4], [1, 2, 3], 2, cache,
                            prefill=lambda c, r: pytest.fail("no prefill"))
    assert kept == [1, 2, 3, 4] and _held(cache) == 4


# -- bridge --------------------------------------------------------------------------------

def test_merge_joins_consecutive_deltas_of_one_kind_only():
    lp = TokenLogprob("a", -0.1)
    call = ToolCall("call_1", "f", "{}")
    items = [TextDelta("a", (lp,)), TextDelta("b", (lp,)), ReasoningDelta("x"),
             ReasoningDelta("y"), call, TextDelta("c"), END]
    assert merge(items) == [TextDelta("ab", (lp, lp)), ReasoningDelta("xy"), call,
                            TextDelta("c"), END]


def test_loop_sink_delivers_a_threads_events_in_order_and_raises_a_posted_error():
    async def main():
        sink = LoopSink(asyncio.get_running_loop(), threading.Event())

        def worker():
            for i in range(200):
                sink(TextDelta(str(i % 10)))
            sink(ValueError("failed late"))
            sink(END)

        threading.Thread(target=worker).start()
        text = ""
        with pytest.raises(ValueError, match="failed late"):
            async for ev in sink.drain():
                text += ev.text
        return text

    assert asyncio.run(main()) == "0123456789" * 20


def test_a_sink_whose_loop_closed_marks_the_request_cancelled():
    loop = asyncio.new_event_loop()
    cancelled = threading.Event()
    sink = LoopSink(loop, cancelled)
    loop.close()
    sink(TextDelta("nobody listens"))
    assert cancelled.is_set()
