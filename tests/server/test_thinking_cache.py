"""The prompt cache with a thinking model whose template rewrites earlier turns.

The model: the real starter weights behind a thinking chat template
(tests/data/chatml-think.jinja: the generation prompt opens ``<think>``, history drops the
reasoning) with two unused special tokens renamed to ``<think>`` / ``</think>``. What the
model generated (reasoning) is not what the next turn resends (an assistant message
without it), so a cache of the generated tokens is useless past the prompt; the server
caches what the next turn will resend instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from tests.helpers import start_server, starter_with_template, stop

DATA = Path(__file__).parent.parent / "data"


@pytest.fixture(scope="module")
def think_server(hf_home, tmp_path_factory):
    model = starter_with_template(
        hf_home, tmp_path_factory.mktemp("models") / "smollm2-think", DATA / "chatml-think.jinja",
        rename_tokens={"<jupyter_script>": "<think>", "<empty_output>": "</think>"})
    s = start_server(tmp_path_factory.mktemp("home-think"), hf_home, "--model", str(model),
                     "--temperature", "0")
    s.model = model
    yield s
    stop(s)


def test_next_turn_prefills_only_its_new_message(think_server):
    client = openai.OpenAI(base_url=think_server.v1, api_key="unused", max_retries=0,
                           timeout=120)
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    # (the 135M model, never trained on <think>, would end at once: EOS is biased away)
    first = client.chat.completions.create(model="local", messages=ask, max_tokens=24,
                                           logit_bias={"2": -100})
    message = first.choices[0].message
    reasoning = getattr(message, "reasoning_content", None) or \
        (message.model_extra or {}).get("reasoning_content")
    assert reasoning  # the template opened <think>: what the model wrote is reasoning
    # The client resends the answer without the reasoning, as OpenAI clients do.
    history = ask + [{"role": "assistant", "content": message.content or ""},
                     {"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(model="local", messages=history, max_tokens=8)
    new = "<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    tokenizer = Tokenizer.from_file(str(think_server.model / "tokenizer.json"))
    uncached = second.usage.prompt_tokens - second.usage.prompt_tokens_details.cached_tokens
    # (a cache of the generated tokens alone ends where turn 1's "<think>\n" was: the
    # re-rendered "<|im_end|>\n" of turn 1 would be prefilled again, 2 tokens more)
    assert uncached == len(tokenizer.encode(new, add_special_tokens=False).ids)


def test_a_json_answer_from_a_thinking_template_is_content_not_reasoning(think_server):
    # Regression: the prompt left the think block open, so the constrained JSON came
    # back as reasoning_content and content was empty.
    client = openai.OpenAI(base_url=think_server.v1, api_key="unused", max_retries=0,
                           timeout=120)
    r = client.chat.completions.create(
        model="local", max_tokens=60, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give me a JSON object for a dog."}])
    message = r.choices[0].message
    assert isinstance(json.loads(message.content), dict)
    assert not (message.model_extra or {}).get("reasoning_content")
