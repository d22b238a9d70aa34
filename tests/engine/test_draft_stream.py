"""kit/engine/decode/draft.py's ``speculative_stream`` and ``aligned`` on the real starter
pair in-process (the float32 starter, its 4-bit variant drafting): closing the stream
rewinds both caches at once, so what the engine stores is final.

Regression: with ``mlx_lm.stream_generate(draft_model=...)`` the rewind past the unused
proposals ran only when the generator was garbage-collected, after the engine had stored
the cache: a stored cache of 47 tokens became 45 (model) and 46 (draft), and the next
request sharing its prefix decoded from misaligned KV (bench/draft.py: different text
with the draft)."""

from __future__ import annotations

import gc

import pytest

from tests.server.test_adapters_model import starter_folder

pytestmark = pytest.mark.model

Q4 = "mlx-kit/SmolLM2-135M-Instruct-4bit"


@pytest.fixture(scope="module")
def pair(hf_home):
    from mlx_lm import load

    from kit.engine.decode.draft import LoadedDraft
    from kit.models.resolve import ModelInfo

    model, tokenizer = load(str(starter_folder(hf_home)))
    draft_model, _ = load(str(starter_folder(hf_home, Q4)))
    draft = LoadedDraft(ModelInfo(Q4, starter_folder(hf_home, Q4), None), draft_model,
                        len(draft_model.layers))
    return model, tokenizer, draft


@pytest.mark.parametrize("max_tokens", [5, 96])  # cut by max_tokens; ended by its end token
def test_closing_the_stream_rewinds_both_caches_before_they_are_stored(pair, max_tokens):
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    from kit.engine.decode.draft import aligned, speculative_stream

    model, tokenizer, draft = pair
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Warm up."}],
                                           add_generation_prompt=True)
    cache = make_prompt_cache(model) + make_prompt_cache(draft.model)
    stream = speculative_stream(model, tokenizer, draft, prompt, 3, max_tokens,
                                prompt_cache=cache)
    steps = []
    for step in stream:
        steps.append(step)
        if step.finish_reason:
            break
    stream.close()
    tokens = aligned(cache, draft, prompt + [s.token for s in steps])
    n = len(model.layers)
    held = (cache[0].offset, cache[n].offset)
    del stream
    gc.collect()
    assert (cache[0].offset, cache[n].offset) == held == (len(tokens), len(tokens))
    # and the text is mlx-lm's own speculative text (which is the model's own, greedy)
    want = list(stream_generate(model, tokenizer, prompt, max_tokens=max_tokens))
    assert "".join(s.text for s in steps) == "".join(r.text for r in want)
    assert steps[-1].finish_reason == want[-1].finish_reason
