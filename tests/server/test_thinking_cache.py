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

import openai
from tokenizers import Tokenizer




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


def _think_end_id(think_server) -> int:
    tokenizer = Tokenizer.from_file(str(think_server.model / "tokenizer.json"))
    return tokenizer.token_to_id("</think>")


def test_responses_report_the_reasoning_tokens_the_model_generated(think_server):
    # Regression: output_tokens_details.reasoning_tokens was a constant 0. The template
    # opens <think> and the model never closes it here: every output token is reasoning.
    client = openai.OpenAI(base_url=think_server.v1, api_key="unused", max_retries=0,
                           timeout=120)
    r = client.responses.create(model="local", input="Tell me a story.", max_output_tokens=12)
    assert [i.type for i in r.output] == ["reasoning"] and r.status == "incomplete"
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens == 12
    with client.responses.stream(model="local", input="Tell me a story.",
                                 max_output_tokens=12) as stream:
        last = list(stream)[-1]
    assert last.response.usage.output_tokens_details.reasoning_tokens == 12


def test_reasoning_tokens_count_only_the_think_block_not_the_answer(think_server):
    # A bias on </think> makes the model close its think block and answer (at
    # temperature 0: 22 tokens of reasoning, </think>, a one-token answer): the count
    # covers the think block (its closing marker included), not the answer after it.
    client = openai.OpenAI(base_url=think_server.v1, api_key="unused", max_retries=0,
                           timeout=120)
    r = client.chat.completions.create(
        model="local", max_tokens=24, logit_bias={"2": -100, str(_think_end_id(think_server)): 8},
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    message = r.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert reasoning and message.content  # it reasoned, then answered
    n = r.usage.completion_tokens_details.reasoning_tokens
    assert 0 < n < r.usage.completion_tokens == 24
    tokenizer = Tokenizer.from_file(str(think_server.model / "tokenizer.json"))
    answer = len(tokenizer.encode(message.content, add_special_tokens=False).ids)
    assert abs((r.usage.completion_tokens - n) - answer) <= 1  # the answer's tokens


def test_an_answer_without_reasoning_reports_zero_reasoning_tokens(think_server):
    # A constrained JSON answer closes the think block in the prompt: nothing generated
    # is reasoning.
    client = openai.OpenAI(base_url=think_server.v1, api_key="unused", max_retries=0,
                           timeout=120)
    r = client.responses.create(model="local", input="Give me a JSON object for a dog.",
                                max_output_tokens=40, text={"format": {"type": "json_object"}})
    assert r.usage.output_tokens > 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    c = client.chat.completions.create(
        model="local", max_tokens=40, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give me a JSON object for a dog."}])
    assert c.usage.completion_tokens_details.reasoning_tokens == 0
