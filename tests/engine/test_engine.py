"""The engine in-process on the real starter: what a consumer of its events can rely on."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path

import pytest

from huggingface_hub import snapshot_download

from kit.config import EngineConfig
from kit.engine.decode.engine import Engine
from kit.engine.types import ChatRequest, Finished, SamplingParams
from kit.models.resolve import resolve_model
from kit.models.starter import STARTER_ID
from tests.greedy import Step, check_agreement


def _started(hf_home, **replace) -> Engine:
    folder = snapshot_download(STARTER_ID, cache_dir=Path(hf_home) / "hub",
                               local_files_only=True)
    e = Engine(dataclasses.replace(resolve_model(folder), **replace), EngineConfig(max_batch=1))
    e.start()
    assert e.wait_ready(120)
    return e


@pytest.fixture(scope="module")
def engine(hf_home):
    e = _started(hf_home)
    yield e
    e.stop()


@pytest.fixture(scope="module")
def small_window_engine(hf_home):
    """The starter with a 600-token context window: the window's edge without an
    8,000-token prefill (the starter's own window is 8,192)."""
    e = _started(hf_home, context_window=600)
    yield e
    e.stop()


def _about(topic: str, n: int, **params) -> ChatRequest:
    """"Tell me about TOPIC.", greedy, at most ``n`` tokens."""
    return ChatRequest(messages=[{"role": "user", "content": f"Tell me about {topic}."}],
                       params=SamplingParams(max_tokens=n, temperature=0.0, **params))


def _reference(engine, topic: str, n: int) -> tuple[str, list[Step]]:
    """:func:`_about` alone again, with each step's lead over the runner-up (for
    :func:`tests.greedy.check_agreement`)."""
    from kit.engine.types import TextDelta

    async def run():
        text, steps = "", []
        async for ev in engine.generate(_about(topic, n, logprobs=True, top_logprobs=2)):
            if isinstance(ev, TextDelta):
                text += ev.text
                steps += [Step(lp.token, lp.top[0][1] - lp.top[1][1]) for lp in ev.logprobs]
        return text, steps
    return asyncio.run(run())


@pytest.mark.parametrize("max_batch", [1, 8])
def test_requests_served_counts_a_request_before_its_finished_event(engine, max_batch):
    # Regression: the count went up only after the next-turn cache prefill, which runs
    # after Finished is posted, so a client asking /health right after its answer saw
    # the old count (the Continue and Codex end-to-end tests caught it).
    engine.max_batch = max_batch

    async def one(i: int) -> tuple[int, int]:
        before = engine.requests_served
        async for ev in engine.generate(ChatRequest(
                messages=[{"role": "user", "content": f"Say {i}."}],
                params=SamplingParams(max_tokens=3, temperature=0.0))):
            if isinstance(ev, Finished):
                return before, engine.requests_served
        raise AssertionError("no Finished event")

    for i in range(3):
        before, at_finish = asyncio.run(one(i))
        assert at_finish == before + 1


def test_a_request_decoding_alone_moves_into_a_batch_when_another_arrives(engine, caplog):
    """Alone, a request decodes with stream_generate (faster for one stream); a second
    request makes it continue inside a batch, KV cache carried over; once the second is
    done, the batch hands it back to decode alone again. Greedy: both texts are what each
    gets alone (up to a near-tie: a batch adds in another order, tests/greedy.py), and
    they decode at the same time."""
    import logging
    import time

    from kit.engine.types import TextDelta

    engine.max_batch = 8

    req = _about

    async def collect(request: ChatRequest, after: asyncio.Event | None = None,
                      first: asyncio.Event | None = None) -> tuple[str, float, float, Finished]:
        """The request's text, first and last token times and Finished; sent once
        ``after`` is set, setting ``first`` at its first token."""
        if after is not None:
            await after.wait()
        text, times, fin = "", [], None
        async for ev in engine.generate(request):
            if isinstance(ev, TextDelta):
                text += ev.text
                times.append(time.monotonic())
                if first is not None:
                    first.set()
            elif isinstance(ev, Finished):
                fin = ev
        return text, times[0], times[-1], fin

    async def main():
        alone = [(await collect(req("cats", 60)))[0], (await collect(req("dogs", 30)))[0]]
        a_decoding = asyncio.Event()  # b is sent once a decodes alone: after its 1st token
        with caplog.at_level(logging.DEBUG, logger="mlx_kit.engine"):
            a, b = await asyncio.gather(collect(req("cats", 60), first=a_decoding),
                                        collect(req("dogs", 30), after=a_decoding))
        return alone, a, b

    alone, a, b = asyncio.run(main())
    assert "joins a batch after" in caplog.text  # it did start alone, then moved
    assert "decodes alone again after" in caplog.text  # and back, once b was done
    check_agreement(alone[0], a[0], lambda: _reference(engine, "cats", 60))
    check_agreement(alone[1], b[0], lambda: _reference(engine, "dogs", 30))
    assert b[1] < a[2]  # b's first token came before a's last: decoded together
    if a[0] == alone[0]:  # alone it runs to the limit (after a near-tie it may stop sooner)
        assert a[3].usage.completion_tokens == 60 and a[3].finish_reason == "length"


def test_a_row_done_while_others_decode_leaves_its_next_turn_prefill_to_that_turn(engine,
                                                                                  caplog):
    """Fitting a finished answer's cache to the next turn's rendering prefills tokens
    (a whole answer where the template drops the reasoning); in a batch every other row
    waited for it (on the H100 a tenth of the engine's time at 8 streams). A row done
    while another decodes is only trimmed to the common prefix, which its next turn
    starts from; a request done alone is still fitted whole."""
    import logging

    from kit.engine.types import Started, TextDelta

    engine.max_batch = 8

    def req(rid: str, messages: list[dict], n: int) -> ChatRequest:
        return ChatRequest(messages=messages, request_id=rid,
                           params=SamplingParams(max_tokens=n, temperature=0.0))

    async def run(request: ChatRequest, after: asyncio.Event | None = None,
                  first: asyncio.Event | None = None) -> tuple[str, Started]:
        if after is not None:
            await after.wait()
        text, started = "", None
        async for ev in engine.generate(request):
            if isinstance(ev, Started):
                started = ev
            elif isinstance(ev, TextDelta):
                text += ev.text
                if first is not None:
                    first.set()
        return text, started

    ask = [{"role": "user", "content": "Name a colour."}]

    async def main():
        decoding = asyncio.Event()
        with caplog.at_level(logging.DEBUG, logger="mlx_kit.engine"):
            (_, _), (short, first) = await asyncio.gather(
                run(req("long-1", [{"role": "user", "content": "Tell me about herons."}], 60),
                    first=decoding),
                run(req("short-1", ask, 6), after=decoding))
        follow = ask + [{"role": "assistant", "content": short},
                        {"role": "user", "content": "Another one?"}]
        _, second = await run(req("short-2", follow, 4))
        return first, second

    first, second = asyncio.run(main())
    said = [r.getMessage() for r in caplog.records]
    prefilled = [m for m in said if "cached the next turn's prefix:" in m]
    trimmed = [m for m in said if "of the next turn's prefix (it prefills" in m]
    # it ended while the long one decoded beside it: trimmed only, nothing prefilled
    assert any(m.startswith("short-1:") for m in trimmed)
    assert not any(m.startswith("short-1:") for m in prefilled)
    assert any(m.startswith("long-1:") for m in prefilled)  # done alone (handed back)
    # the next turn starts from that prefix: the whole first prompt and more
    assert second.cached_tokens > first.prompt_tokens


@pytest.mark.parametrize("beside, topics", [(False, ("otters", "moths")),
                                            (True, ("beavers", "crickets"))],
                         ids=["idle engine", "beside a decoding request"])
def test_a_request_that_arrives_while_the_first_is_prepared_prefills_with_it(
        engine, caplog, monkeypatch, beside, topics):
    """Requests a client sends together reach the engine a moment apart. One that
    arrives while the first is still being prepared (template, tokens, prompt-cache
    lookup) does not wait for the first's prefill and first token: both prompts
    prefill together, whether the first was to decode alone (it moves into the batch
    before its prefill) or joins a batch (``beside``: another request decodes; the batch
    admits what arrived before its next step). Greedy: each text is what it gets alone
    (asked after, from the prompt cache the batch left: prompts not asked before, so the
    batch prefills them)."""
    import logging
    import threading

    from kit.engine.types import Started, TextDelta

    engine.max_batch = 8
    prepared = threading.Event()
    real = engine.pipeline.prepare

    def prepare(job, *args, **kwargs):
        run = real(job, *args, **kwargs)
        if job.request.request_id == "first-1":  # hold it until the second is queued
            prepared.set()
            for _ in range(1000):
                if not engine.inbox.empty():
                    break
                threading.Event().wait(0.01)
        return run

    monkeypatch.setattr(engine.pipeline, "prepare", prepare)
    seen: list[tuple[str, str]] = []  # (request, event) in the order the loop got them
    # the batch's calls once the first is prepared (on the class: a batch the worker
    # still runs from the last test's requests has its instance already)
    calls: list[str] = []
    from kit import mlx_lm_api

    generator = mlx_lm_api.BatchGenerator
    for name in ("insert", "next"):
        def spy(self, *args, _real=getattr(generator, name), _name=name, **kwargs):
            if prepared.is_set():
                calls.append(_name)
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(generator, name, spy)

    def req(rid: str, topic: str, n: int) -> ChatRequest:
        return dataclasses.replace(_about(topic, n), request_id=rid)

    async def text(request: ChatRequest, after: threading.Event | None = None,
                   first: asyncio.Event | None = None) -> str:
        if after is not None:
            await asyncio.to_thread(after.wait, 10)
        out = ""
        async for ev in engine.generate(request):
            if isinstance(ev, Started):
                seen.append((request.request_id, "started"))
            elif isinstance(ev, TextDelta):
                if not out:
                    seen.append((request.request_id, "first token"))
                    if first is not None:
                        first.set()
                out += ev.text
        return out

    async def main():
        # a moment for the worker to leave the batch the last test's requests ran in, so
        # that the first decodes alone (the batch's path gives the same order)
        await asyncio.sleep(0.2)
        first, second = topics
        decoding = asyncio.Event()
        with caplog.at_level(logging.DEBUG, logger="mlx_kit.engine"):
            long = None
            if beside:
                long = asyncio.create_task(text(req("long-0", "herons", 40), first=decoding))
                await decoding.wait()
            together = await asyncio.gather(text(req("first-1", first, 24)),
                                            text(req("second-1", second, 12), after=prepared))
            if long is not None:
                await long
        alone = [await text(req("alone-1", first, 24)),
                 await text(req("alone-2", second, 12))]
        return alone, together

    alone, together = asyncio.run(main())
    # the second was started (prepared, in the batch) before the first had a token: the
    # first did not prefill alone
    assert seen.index(("second-1", "started")) < seen.index(("first-1", "first token")), seen
    assert calls[:3] == ["insert", "insert", "next"], calls  # both in before one step
    said = [r.getMessage() for r in caplog.records]
    assert not any(m.startswith("first-1: joins a batch after") for m in said)
    if beside:  # the batch's path was taken: the first joined a batch another one ran
        assert any(m.startswith("long-0: joins a batch after") for m in said), said
    cached, prompt = map(int, re.search(r"(\d+) of its (\d+) prompt tokens cached",
                                        next(m for m in said if m.startswith("first-1: starts"))
                                        ).groups())
    assert prompt - cached > 5  # its own words to prefill, in the batch (a template prefix
    # other tests left may be cached)
    check_agreement(alone[0], together[0], lambda: _reference(engine, topics[0], 24))
    check_agreement(alone[1], together[1], lambda: _reference(engine, topics[1], 12))


# -- prompts over the context window ------------------------------------------------------

def _spy_encode(engine, monkeypatch) -> list[int]:
    """Record the length of every text the real tokenizer encodes (it still encodes)."""
    hf = engine.slot.tokenizer._tokenizer
    seen: list[int] = []
    real = hf.encode

    def encode(text, *args, **kwargs):
        seen.append(len(text))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(hf, "encode", encode)
    return seen


async def _first_event(engine, request: ChatRequest):
    """The first event of ``request`` (then the request is cancelled), or its error."""
    from kit.engine.types import InvalidRequest

    try:
        async for ev in engine.generate(request):
            return ev
    except InvalidRequest as e:
        return e


BIG = "hello world " * 700_000  # 8.4 MB: ~1.4M tokens, 170x the starter's window


@pytest.mark.parametrize("kind", ["messages", "legacy prompt"])
def test_a_prompt_far_over_the_window_is_rejected_before_it_is_tokenized(engine, monkeypatch,
                                                                        kind):
    # Regression (issue 11): a 20 MB body was tokenized in full (10M tokens, 29-85 s of
    # the engine's worker) before the context check.
    from kit.engine.types import InvalidRequest

    seen = _spy_encode(engine, monkeypatch)
    req = ChatRequest(messages=[{"role": "user", "content": BIG}],
                      params=SamplingParams(max_tokens=5)) if kind == "messages" else \
        ChatRequest(messages=[], prompt=BIG, params=SamplingParams(max_tokens=5))
    error = asyncio.run(_first_event(engine, req))
    assert isinstance(error, InvalidRequest) and error.code == "context_length_exceeded"
    message = str(error)
    assert "maximum context length is 8192 tokens" in message and "at least" in message
    assert "hello" not in message and len(message) < 300  # no echo of the prompt
    assert not [n for n in seen if n > 100_000]  # nothing big was tokenized

    with pytest.raises(InvalidRequest) as counted:
        engine.count_tokens(ChatRequest(messages=[{"role": "user", "content": BIG}]))
    assert counted.value.code == "context_length_exceeded"
    assert not [n for n in seen if n > 100_000]


def _text_of(engine, n_tokens: int) -> tuple[ChatRequest, int]:
    """A one-message request whose prompt is exactly ``n_tokens`` tokens."""
    def request(words: int) -> ChatRequest:
        return ChatRequest(messages=[{"role": "user", "content": "x" + " y" * words}])

    overhead = engine.count_tokens(request(0)) - 1
    req = request(n_tokens - overhead - 1)
    return req, engine.count_tokens(req)


def test_a_prompt_that_fits_the_window_exactly_is_served_and_one_more_token_is_not(
        small_window_engine):
    # the bound never rejects what fits: the decision at the edge is the exact count
    from kit.engine.types import InvalidRequest, Started

    engine = small_window_engine

    window = engine.model_info.context_window
    req, n = _text_of(engine, window - 4)
    assert n == window - 4
    req.params = SamplingParams(max_tokens=4)
    started = asyncio.run(_first_event(engine, req))  # cancelled during its prefill
    assert isinstance(started, Started) and started.prompt_tokens == window - 4
    req.params = SamplingParams(max_tokens=5)
    error = asyncio.run(_first_event(engine, req))
    assert isinstance(error, InvalidRequest) and error.code == "context_length_exceeded"
    assert f"({window - 4} in the messages, 5 in the completion)" in str(error)  # exact


def test_count_tokens_is_exact_beyond_the_window_until_the_bound_decides(engine):
    # what the bound does not decide is counted exactly, even above the window
    req, n = _text_of(engine, 9000)
    assert n == 9000 == len(engine.pipeline.prompts.render(req, req.messages, generation_prompt=True))


def test_rendering_then_encoding_gives_the_tokens_of_apply_chat_template(engine):
    # the prompt is rendered to text first (to bound it), then encoded: same ids as the
    # tokenizer's own apply_chat_template(tokenize=True)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi <|im_end|> there\n\n  é 🙂"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "42"}]
    req = ChatRequest(messages=messages)
    expected = engine.slot.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=True)
    if isinstance(expected, dict):
        expected = expected["input_ids"]
    assert engine.pipeline.prompts.render(req, messages, generation_prompt=True) == list(expected)


@pytest.mark.parametrize("kind", ["messages", "legacy prompt"])
def test_a_lone_surrogate_is_a_400_naming_invalid_unicode(engine, kind):
    # rendering and encoding are now two steps: the encoder's TypeError must stay a 400
    from kit.engine.types import InvalidRequest

    text = "hi \udc80 there"
    req = ChatRequest(messages=[{"role": "user", "content": text}]) if kind == "messages" \
        else ChatRequest(messages=[], prompt=text)
    error = asyncio.run(_first_event(engine, req))
    assert isinstance(error, InvalidRequest) and "lone UTF-16 surrogate" in str(error)
    with pytest.raises(InvalidRequest, match="surrogate"):
        engine.count_tokens(req)


def test_a_failed_batch_insert_releases_its_reservation_and_ends_its_stream(engine,
                                                                           monkeypatch):
    # Regression (review 2026-12-01, batch.py): bg.insert raised after prepare() had
    # reserved memory and posted Started; the request's stream never ended and its
    # reservation was never given back, so admission deferred every later request
    # forever. A failure that cannot happen on its own here: BatchGenerator.insert is
    # made to raise once (mlx-lm's real one runs every other call).
    from mlx_lm.generate import BatchGenerator

    from kit.engine.types import EngineError

    engine.max_batch = 8
    real, calls = BatchGenerator.insert, []

    def insert(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("insert failed")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(BatchGenerator, "insert", insert)

    async def outcome(i: int) -> str:
        try:
            async for ev in engine.generate(ChatRequest(
                    messages=[{"role": "user", "content": f"Count to {i}."}],
                    params=SamplingParams(max_tokens=8, temperature=0.0))):
                if isinstance(ev, Finished):
                    return "finished"
        except EngineError:
            return "error"
        return "ended without Finished"

    async def together(ns: range) -> list[str]:
        return await asyncio.wait_for(asyncio.gather(*(outcome(i) for i in ns)), 120)

    results = asyncio.run(together(range(3)))
    assert calls, "no batch ran"
    assert sorted(results) == ["error", "finished", "finished"]  # each stream ended
    assert engine.admission["reserved_bytes"] == 0
    # and admission is not wedged: the next requests run
    assert asyncio.run(together(range(7, 9))) == ["finished", "finished"]


def test_a_request_cancelled_while_it_waits_for_memory_is_forgotten(engine):
    # Regression (review 2026-12-01, batch.py/admission.py): a request cancelled while
    # deferred was ended by Pipeline.admit without leaving Admission's waiting set, so
    # its id stayed there (a later job given the same id was never counted as deferred).
    # The deferral is made with a room of 1000 tokens of KV that another job holds.
    from kit.engine.cache.admission import Deferred, Room
    from kit.engine.decode.bridge import END
    from kit.engine.decode.run import Job

    admission, per = engine.pipeline.admission, 46_080
    room = Room(1000 * per, "budget", 0, per, lambda: 0, lambda n: None)
    posted: list = []
    holder = object()
    job = Job(ChatRequest(messages=[{"role": "user", "content": "Hi"}],
                          params=SamplingParams(max_tokens=3)), posted.append)
    before = admission.deferred
    admission.admit(holder, "holder", 100, 900, room)
    try:
        with pytest.raises(Deferred):
            admission.admit(job, "r1", 100, 10, room, running=True)
        assert id(job) in admission._waiting and admission.deferred == before + 1
        job.cancelled.set()
        assert engine.pipeline.admit(job) is False  # what the batch asks before retrying
        assert posted == [END] and id(job) not in admission._waiting
    finally:
        admission.release(holder)
    assert admission.snapshot()["reserved_bytes"] == 0


def test_a_request_that_cannot_join_leaves_the_lone_one_its_every_token(engine):
    """Regression: a request decoding alone moved into a batch for a newcomer that then
    failed before the batch ran a step (here: a logit_bias id outside the vocabulary),
    and the batch, down to it again, handed it back at once, trimming a token its cache
    did not hold yet: the model lost a word the client had already received. The lone
    request's text must be the one it gets with no newcomer."""
    from kit.engine.types import InvalidRequest, TextDelta

    engine.max_batch = 8

    def req(n: int, **params) -> ChatRequest:
        return ChatRequest(messages=[{"role": "user", "content": "Tell me about owls."}],
                           params=SamplingParams(max_tokens=n, temperature=0.0, **params))

    async def text_of(request: ChatRequest, started: asyncio.Event | None = None) -> str:
        text = ""
        async for ev in engine.generate(request):
            if isinstance(ev, TextDelta):
                text += ev.text
                if started is not None:
                    started.set()
        return text

    async def failing(after: asyncio.Event) -> str:
        await after.wait()
        try:
            await text_of(req(4, logit_bias=((10 ** 9, 1.0),)))
        except InvalidRequest as e:
            return str(e)
        return ""

    async def main():
        alone = await text_of(req(48))
        started = asyncio.Event()
        got, refusal = await asyncio.gather(text_of(req(48), started), failing(started))
        return alone, got, refusal

    alone, got, refusal = asyncio.run(main())
    assert "logit_bias" in refusal  # the newcomer was refused, after the lone one moved
    assert got == alone
