"""kit/engine/decode/compiled.py on the real starter in-process: the compiled decode step
writes the eager step's tokens (greedy) and leaves the same KV behind, across a growth of
its buffer, from a cached prefix, and through the engine (``compile_decode="on"``)."""

from __future__ import annotations

import asyncio

import pytest

from tests.server.test_adapters_model import starter_folder

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def starter(hf_home):
    from mlx_lm import load

    return load(str(starter_folder(hf_home)))


def run(model, tokenizer, prompt, cache, max_tokens, compiled):
    """Greedy tokens of ``stream_generate`` (its end tokens biased away: every call
    writes ``max_tokens``) and the cache it leaves (KVCache objects)."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    from kit.engine.decode.compiled import CompiledModel

    no_eos = make_logits_processors(logit_bias={i: -100.0 for i in tokenizer.eos_token_ids})
    step = CompiledModel(model, cache) if compiled else None
    tokens = [g.token for g in stream_generate(step or model, tokenizer, prompt,
                                               max_tokens=max_tokens, logits_processors=no_eos,
                                               prompt_cache=step.caches if step else cache)]
    return tokens, (step.kv_caches() if step else cache), step


def test_the_compiled_step_writes_the_eager_tokens_across_a_growth_of_its_buffer(starter):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from kit.engine.decode.compiled import CHUNK, StaticKVCache

    model, tokenizer = starter
    text = "Count the foxes: " + " ".join(f"fox{i}" for i in range(70))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                           add_generation_prompt=True)
    assert CHUNK - 40 < len(prompt) < CHUNK  # the decode crosses the first chunk's end
    eager, eager_cache, _ = run(model, tokenizer, prompt, make_prompt_cache(model), 48, False)
    compiled, cache, step = run(model, tokenizer, prompt, make_prompt_cache(model), 48, True)
    assert compiled == eager and len(eager) == 48
    assert all(isinstance(c, StaticKVCache) and c.capacity == 2 * CHUNK for c in step.caches)
    # the same tokens' KV, as the KVCache the prompt cache stores
    assert [c.offset for c in cache] == [c.offset for c in eager_cache]
    k, e = cache[0].state[0], eager_cache[0].state[0][..., :cache[0].offset, :]
    assert mx.allclose(k, e, atol=1e-4).item()


def test_a_cached_prefix_continues_compiled_as_it_does_eagerly(starter):
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = starter
    turn = tokenizer.apply_chat_template([{"role": "user", "content": "Name three rivers."}],
                                         add_generation_prompt=True)
    outs = []
    for compiled in (False, True):
        cache = make_prompt_cache(model)
        first, cache, _ = run(model, tokenizer, turn, cache, 12, compiled)
        # the next turn feeds what the cache does not hold yet
        held = (turn + first)[:cache[0].offset]
        nxt = held + tokenizer.encode(" And three lakes?", add_special_tokens=False)
        assert len(held) > len(turn)
        second, _, _ = run(model, tokenizer, nxt[len(held):], cache, 12, compiled)
        outs.append((first, second))
    assert outs[0] == outs[1]


def test_the_engine_decodes_a_lone_request_compiled_with_the_eager_text(hf_home):
    from kit.config import EngineConfig
    from kit.engine.decode.engine import Engine
    from kit.engine.types import ChatRequest, Finished, SamplingParams
    from kit.models.resolve import resolve_model

    info = resolve_model(str(starter_folder(hf_home)))
    got = {}
    for mode in ("off", "on"):
        engine = Engine(info, EngineConfig(compile_decode=mode, warmup="off",
                                           prompt_cache_disk=0))
        engine.start()
        assert engine.wait_ready(120)
        assert engine.slot.compile_decode is (mode == "on")

        async def ask(messages):
            text, usage = "", None
            req = ChatRequest(messages=messages, params=SamplingParams(max_tokens=24,
                                                                       temperature=0))
            async for ev in engine.generate(req):
                text += getattr(ev, "text", "") or ""
                if isinstance(ev, Finished):
                    usage = ev.usage
            return text, usage

        first = [{"role": "user", "content": "What is a compiler?"}]
        a, _ = asyncio.run(ask(first))
        b, usage = asyncio.run(ask(first + [{"role": "assistant", "content": a},
                                            {"role": "user", "content": "Shorter."}]))
        engine.stop()
        got[mode] = (a, b, usage.cached_tokens > 0)
    assert got["on"] == got["off"] and got["on"][2]  # the second turn reused the cache


def test_compiled_decode_is_used_only_for_the_families_and_caches_it_was_checked_on():
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

    from kit.engine.decode.compiled import usable

    class Model:
        def __init__(self, kind):
            self.model_type = kind

    assert usable(Model("llama"), [KVCache(), KVCache()], enabled=True)
    assert usable(Model("qwen3"), [KVCache()], enabled=True)
    assert not usable(Model("llama"), [KVCache()], enabled=False)
    assert not usable(Model("gemma3_text"), [KVCache()], enabled=True)
    assert not usable(Model("llama"), [KVCache(), RotatingKVCache(max_size=8)], enabled=True)
    assert not usable(Model("llama"), [QuantizedKVCache()], enabled=True)
    assert not usable(Model("llama"), [], enabled=True)
