"""A 3-rank server (``serve --ranks 3``, tensor parallel on the ring backend) answers
as the single-process server does: the same greedy text (up to a near-tie: the ranks'
all_sum adds in another order, see tests/greedy.py) and the same prompt token counts
through chat completions, Responses and Messages (official SDKs), streaming or not; the
same texts batched as alone; the prompt cache hit on every rank; a cancelled stream, a
swap and a failed swap leave every rank in step; /health names the 3 live ranks and
their shares of the weights. The ranks agree with each other exactly (one computation).

Both servers run the decisive tiny model (tests/distributed/conftest.py): its answers are
words without meaning, and each step's winner is clear, so a world that computed anything
else than one process would write other words.

Every rank runs the same worker and logs what it did (``rank N`` lines in the server's
log): where a test says "on every rank", it reads those lines.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass

import httpx
import psutil
import pytest

from tests.greedy import assert_agrees
from tests.helpers import anthropic_for, openai_for, wait_until

FRANCE = "What is the capital of France?"
PROMPTS = [FRANCE, "Name a color."]
#: the tiny model never ends early (no special token can win): every answer is this long
MAX_TOKENS = 16
#: a stream to cancel: far more than it can decode before the cancel reaches the ranks
LONG = 4000
RANKS = 3


def agrees(reference, prompt: str | list[dict], expected: str, got: str,
           max_tokens: int = MAX_TOKENS) -> None:
    """``got`` is ``expected``, the greedy answer of ``reference`` (a server) to
    ``prompt`` (one user turn, or messages) in ``max_tokens``, computed with other
    numerics (:func:`tests.greedy.assert_agrees`)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    assert_agrees(reference, messages, expected, got, max_tokens=max_tokens)


@dataclass(frozen=True)
class Answer:
    """What a user reads off one answer: its text, the prompt's token count (cached part
    included), how many of those came from the prompt cache, and the request id the
    server logs it under."""
    text: str
    prompt_tokens: int
    cached: int
    id: str


def chat(client, messages: list[dict], stream: bool, max_tokens: int = MAX_TOKENS) -> Answer:
    """One chat completion through the OpenAI SDK."""
    kw = dict(model="local", messages=messages, max_tokens=max_tokens, temperature=0)
    if not stream:
        r = client.chat.completions.create(**kw)
        u = r.usage
        return Answer(r.choices[0].message.content, u.prompt_tokens,
                      u.prompt_tokens_details.cached_tokens, r.id)
    text, usage, rid = "", None, ""
    for chunk in client.chat.completions.create(**kw, stream=True,
                                                stream_options={"include_usage": True}):
        rid = chunk.id
        for c in chunk.choices:
            text += c.delta.content or ""
        usage = chunk.usage or usage
    return Answer(text, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, rid)


def responses(client, prompt: str, stream: bool) -> Answer:
    """One response through the OpenAI SDK's ``responses.create``."""
    kw = dict(model="local", input=prompt, max_output_tokens=MAX_TOKENS, temperature=0)
    if not stream:
        r = client.responses.create(**kw)
    else:  # a stream ends with response.completed, or response.incomplete when cut
        events = list(client.responses.create(**kw, stream=True))
        assert events[-1].type in ("response.completed", "response.incomplete")
        r = events[-1].response
        streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert streamed == r.output_text
    u = r.usage
    return Answer(r.output_text, u.input_tokens, u.input_tokens_details.cached_tokens, r.id)


def messages(client, prompt: str, stream: bool) -> Answer:
    """One message through the Anthropic SDK (its ``input_tokens`` leaves out the
    cached part: added back, so both servers' counts compare whatever each cached)."""
    kw = dict(model="local", max_tokens=MAX_TOKENS,  # greedy: the servers default to it
              messages=[{"role": "user", "content": prompt}])
    if not stream:
        m = client.messages.create(**kw)
        text = "".join(b.text for b in m.content if b.type == "text")
    else:
        with client.messages.stream(**kw) as s:
            text = "".join(s.text_stream)
            m = s.get_final_message()
    cached = m.usage.cache_read_input_tokens or 0
    return Answer(text, m.usage.input_tokens + cached, cached, m.id)


def ask(server, api: str, prompt: str, stream: bool) -> Answer:
    """``prompt`` as one user turn to ``server`` through ``api`` (chat, responses,
    messages)."""
    if api == "messages":
        return messages(anthropic_for(server), prompt, stream)
    client = openai_for(server)
    if api == "responses":
        return responses(client, prompt, stream)
    return chat(client, [{"role": "user", "content": prompt}], stream)


def rank_lines(server, request_id: str, what: str) -> dict[int, str]:
    """Each rank's last log line about ``request_id`` whose rest (after ``ID: ``)
    matches ``what`` (a regex), by rank: ``{rank: the rest of the line}``."""
    found: dict[int, str] = {}
    pattern = re.compile(rf" rank (\d+) \[[^\]]*\] mlx_kit\.engine: {re.escape(request_id)}: "
                         r"(.*)$", re.M)
    for m in pattern.finditer(server.log_text()):
        if re.search(what, m.group(2)):
            found[int(m.group(1))] = m.group(2)
    return found


def wait_ranks(server, request_id: str, what: str, timeout: float = 60) -> dict[int, str]:
    """:func:`rank_lines`, once every rank logged one (the ranks' output reaches the log
    through mlx.launch a little after rank 0 answered)."""
    return wait_until(lambda: len(found := rank_lines(server, request_id, what)) == RANKS
                      and found, timeout, every=0.1,
                      what=f"{RANKS} ranks logging {what!r} for {request_id}")


def rank_texts(server, request_id: str) -> set[str]:
    """The distinct texts the ranks generated for ``request_id`` (each rank decodes the
    same tokens with its own detokenizer and logs the text at debug level)."""
    lines = wait_ranks(server, request_id, "^text ")
    return {line[len("text "):] for line in lines.values()}


# --- /health -----------------------------------------------------------------------------

def test_health_names_three_live_ranks_each_holding_a_share_of_the_weights(
        ranks_server, single_server):
    h, single = ranks_server.health(), single_server.health()
    assert h["status"] == "ok" and h["model_state"] == "ready"
    assert h["model"] == single["model"] and "tiny-decisive" in h["model"]
    d = h["distributed"]
    assert (d["world_size"], d["backend"], d["mode"]) == (RANKS, "ring", "tensor")
    assert [r["rank"] for r in d["ranks"]] == list(range(RANKS))
    pids = [r["pid"] for r in d["ranks"]]
    assert len(set(pids)) == RANKS and h["pid"] not in pids
    for pid in pids:  # alive, and a rank process (not something that reused the pid)
        p = psutil.Process(pid)
        assert p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        assert "kit.engine.distributed.rank" in " ".join(p.cmdline())
    whole = single["memory"]["weights_bytes"]
    assert "distributed" not in single and whole > 38e6  # embedding + output layer
    for r in d["ranks"]:
        mem = r["memory"]
        assert mem["active_bytes"] > 0
        # a third of each layer, plus the (unsharded) embedding and output layer
        assert 0 < mem["weights_bytes"] < whole, r
    # the ranks share this host's cores instead of each running a pool of all of them
    threads = max(1, len(os.sched_getaffinity(0)) // RANKS)
    for r in range(RANKS):
        assert re.search(rf"rank {r} .*{RANKS} ranks on this host: {threads} BLAS thread",
                         ranks_server.log_text()), f"rank {r} named no BLAS thread count"


# --- the same answers --------------------------------------------------------------------

#: every protocol, streamed and whole, each prompt
PAIRS = [(api, stream, prompt) for api in ("chat", "responses", "messages")
         for stream in (False, True) for prompt in PROMPTS]


@pytest.mark.parametrize(("api", "stream", "prompt"), PAIRS,
                         ids=[f"{a}-{'stream' if s else 'whole'}-{PROMPTS.index(p)}"
                              for a, s, p in PAIRS])
def test_three_ranks_answer_as_one_process(ranks_server, single_server, api, stream, prompt):
    one = ask(single_server, api, prompt, stream)
    three = ask(ranks_server, api, prompt, stream)
    agrees(single_server, prompt, one.text, three.text)
    assert three.prompt_tokens == one.prompt_tokens
    if api == "chat":  # every rank decoded the same text, not only rank 0
        assert rank_texts(ranks_server, three.id) == {repr(three.text)}


# --- batching across ranks ---------------------------------------------------------------

BATCH = ["Tell me about cats.", FRANCE, "What is 2+2?"]
#: long enough that three answers arriving together overlap on the tiny model
BATCH_TOKENS = 64


def streams_at_once(server, prompts: list[str]) -> list[tuple[float, float, str]]:
    """``prompts`` as concurrent streaming chat requests (one thread each): each one's
    (first content at, last content at, text), in ``prompts``' order."""
    spans: list = [None] * len(prompts)
    errors: list = []  # error events in the streams (the world out of step, say)
    go = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        first = last = None
        text = ""
        go.wait()
        with httpx.stream("POST", server.v1 + "/chat/completions", timeout=180, json={
                "model": "local", "messages": [{"role": "user", "content": prompts[i]}],
                "max_tokens": BATCH_TOKENS, "temperature": 0, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    data = json.loads(line[6:])
                    if "error" in data:
                        errors.append(data["error"])
                    for c in data.get("choices", ()):
                        if c["delta"].get("content"):
                            first = first or time.monotonic()
                            last = time.monotonic()
                            text += c["delta"]["content"]
        spans[i] = (first, last, text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors and all(spans), errors or spans
    return spans


def test_concurrent_requests_on_three_ranks_answer_as_each_alone(ranks_server, single_server):
    # Regression: 3 concurrent requests on 3 ranks hung the world until --rank-timeout
    # (the followers unpickled garbage from a share whose all_sum ran on mx.cpu beside a
    # decode step in flight on the generation stream; kit/engine/distributed/world.py).
    # Each batched answer is compared with one process's answer alone (that one process
    # batches as it answers alone: tests/server/test_openai_chat.py).
    alone_one = [chat(openai_for(single_server), [{"role": "user", "content": p}], False,
                      max_tokens=BATCH_TOKENS).text for p in BATCH]
    spans = streams_at_once(ranks_server, BATCH)
    assert max(s[0] for s in spans) < min(s[1] for s in spans)  # they decoded together
    for prompt, span, alone_text in zip(BATCH, spans, alone_one):
        agrees(single_server, prompt, alone_text, span[2], BATCH_TOKENS)
    assert ranks_server.health()["status"] == "ok"


def test_sampling_with_a_seed_repeats_on_three_ranks_and_every_rank_draws_the_same(
        ranks_server):
    # Not compared with one process: a sampled step has no lead to judge a departure by
    # (the draw depends on every logit), and the ranks' logits differ from one process's
    # in the last bits (tests/greedy.py). Within the world the computation is one.
    joke = [{"role": "user", "content": "Tell me a joke."}]

    def sampled(server, **kw):
        r = openai_for(server).chat.completions.create(
            model="local", messages=joke, max_tokens=MAX_TOKENS, temperature=1.0, **kw)
        return r.choices[0].message.content, r.id

    three, rid = sampled(ranks_server, seed=7)
    assert three and sampled(ranks_server, seed=7)[0] == three  # the seed is honoured
    assert rank_texts(ranks_server, rid) == {repr(three)}
    # no seed: rank 0's draws are not the others' unless their generators agree
    text, rid = sampled(ranks_server)
    assert rank_texts(ranks_server, rid) == {repr(text)}


# --- the prompt cache on every rank ------------------------------------------------------

def test_a_second_turn_hits_the_prompt_cache_on_every_rank(ranks_server, single_server):
    first = [{"role": "user", "content": "Name a fruit."}]
    turn1 = chat(openai_for(ranks_server), first, False)
    again = first + [{"role": "assistant", "content": turn1.text},
                     {"role": "user", "content": "And a vegetable?"}]
    three = chat(openai_for(ranks_server), again, False)
    one = chat(openai_for(single_server), again, False)
    assert three.cached > 0
    agrees(single_server, again, one.text, three.text)
    assert three.prompt_tokens == one.prompt_tokens
    # every rank found the same cached prefix (a rank that missed it would run another
    # prefill than its peers: the world would be out of step)
    lines = wait_ranks(ranks_server, three.id, r"\(\d+ cached\)")
    cached = {re.search(r"\((\d+) cached\)", line).group(1) for line in lines.values()}
    assert cached == {str(three.cached)}


# --- a cancelled stream ------------------------------------------------------------------

def test_a_cancelled_stream_leaves_every_rank_serving_the_same_answers(ranks_server,
                                                                     single_server):
    client = openai_for(ranks_server)
    before = ranks_server.health()["requests_served"]
    stream = client.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "Write a long story."}],
        max_tokens=LONG, temperature=0, stream=True)
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 2:
            break
    stream.close()
    # every rank stopped that request at the same step (the cancel was shared)
    lines = wait_ranks(ranks_server, chunks[0].id, r"generated \d+, .*cancelled")
    generated = {re.search(r"generated (\d+)", line).group(1) for line in lines.values()}
    assert len(generated) == 1 and int(generated.pop()) < LONG
    after = chat(client, [{"role": "user", "content": FRANCE}], False)
    one = chat(openai_for(single_server), [{"role": "user", "content": FRANCE}], False)
    agrees(single_server, FRANCE, one.text, after.text)
    h = ranks_server.health()
    assert h["status"] == "ok" and h["model_state"] == "ready"
    assert h["requests_served"] == before + 2  # the cancelled one is counted too


def test_a_stream_cancelled_inside_a_batch_leaves_the_others_their_answers(ranks_server,
                                                                          single_server):
    client = openai_for(ranks_server)
    others = ["Tell me about cats.", "What is 2+2?"]
    alone = [chat(openai_for(single_server), [{"role": "user", "content": p}], False).text
             for p in others]
    got: list = [None] * len(others)
    cancelled: dict = {}

    def cancel() -> None:
        stream = client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": "Write a long story."}],
            max_tokens=LONG, temperature=0, stream=True)
        for n, chunk in enumerate(stream, 1):
            cancelled["id"] = chunk.id
            if n == 3:
                break
        stream.close()

    def one(i: int) -> None:
        got[i] = chat(client, [{"role": "user", "content": others[i]}], False).text

    threads = [threading.Thread(target=cancel)] + [
        threading.Thread(target=one, args=(i,)) for i in range(len(others))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    for prompt, alone_text, batched in zip(others, alone, got):
        agrees(single_server, prompt, alone_text, batched)
    wait_ranks(ranks_server, cancelled["id"], "cancelled$")  # on every rank
    assert ranks_server.health()["status"] == "ok"


# --- swaps -------------------------------------------------------------------------------

def answers(server) -> list[str]:
    return [chat(openai_for(server), [{"role": "user", "content": p}], False).text
            for p in PROMPTS]


def ranks_weights(server) -> list[int]:
    return [r["memory"]["weights_bytes"] for r in server.health()["distributed"]["ranks"]]


def test_a_swap_and_back_answers_as_one_process_and_a_failed_swap_keeps_every_rank(
        ranks_server, single_server, world_model, other_world_model):
    first, other = str(world_model), str(other_world_model)
    first_answers = answers(single_server)
    for s in (ranks_server, single_server):
        r = s.swap(other, timeout=240)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == other and r.json()["previous"] == first
    assert ranks_server.health()["model"] == other
    other_whole = single_server.health()["memory"]["weights_bytes"]
    assert all(0 < w < other_whole for w in ranks_weights(ranks_server))
    other_answers = answers(single_server)
    assert other_answers != first_answers  # another model: not the first one's words
    for prompt, one, three in zip(PROMPTS, other_answers, answers(ranks_server)):
        agrees(single_server, prompt, one, three)

    for s in (ranks_server, single_server):
        r = s.swap(first, timeout=240)
        assert r.status_code == 200 and r.json()["model"] == first, r.text
    # the world back on the first model answers as before the swaps (asked once more
    # below, after a failed swap too: one request on the world covers both)

    weights = ranks_weights(ranks_server)
    r = ranks_server.swap("nobody/no-such-model")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found"
    assert "'nobody/no-such-model' not found (available: " in err["message"]
    h = ranks_server.health()
    assert h["status"] == "ok" and h["model"] == first and h["swaps"] == 2
    assert ranks_weights(ranks_server) == weights  # every rank keeps its shard
    for prompt, before in zip(PROMPTS, first_answers):
        after = chat(openai_for(ranks_server), [{"role": "user", "content": prompt}], False)
        agrees(single_server, prompt, before, after.text)
        assert rank_texts(ranks_server, after.id) == {repr(after.text)}


def test_a_swap_to_a_checkpoint_missing_weights_is_refused_on_every_rank(
        ranks_server, single_server, world_model, tmp_path):
    # mlx-lm's sharded_load loads with strict=False: a checkpoint missing a layer was
    # served with random weights in its place; the ranks now load strictly, agree, and
    # the old model keeps serving
    import shutil

    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "missing-layers"
    broken.mkdir()
    for f in world_model.iterdir():
        if not f.name.startswith(".") and not f.name.startswith("model.safetensors"):
            shutil.copy(f.resolve(), broken / f.name)
    weights = load_file(str(world_model / "model.safetensors"))
    kept = {n: w for n, w in weights.items() if "layers.1." not in n}
    save_file(kept, str(broken / "model.safetensors"), metadata={"format": "mlx"})
    before = ranks_weights(ranks_server)
    r = ranks_server.swap(str(broken), timeout=240)
    assert r.status_code >= 400, r.text
    assert "Missing" in r.json()["error"]["message"]
    h = ranks_server.health()
    assert h["status"] == "ok" and h["model"] == str(world_model)
    assert ranks_weights(ranks_server) == before
    after = chat(openai_for(ranks_server), [{"role": "user", "content": FRANCE}], False)
    one = chat(openai_for(single_server), [{"role": "user", "content": FRANCE}], False)
    agrees(single_server, FRANCE, one.text, after.text)
