"""Sequential decode: one request alone on ``mlx_lm.stream_generate`` (the in-process
speed; one stream on ``BatchGenerator`` measured 0.66 of it on an H200), and its hand-off
into a batch (:mod:`kit.engine.decode.batch`) when another request arrives meanwhile."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

from kit import mlx_lm_api
from kit.engine.decode import compiled, vision_decode
from kit.engine.decode.batch import next_text
from kit.engine.decode.bridge import END
from kit.engine.decode.draft import aligned, speculative_stream, target_part
from kit.engine.decode.pipeline import Pipeline
from kit.engine.decode.prefill import prefill_step_size
from kit.engine.decode.run import Cancelled, Job, Joined, Run
from kit.engine.decode.sampling import PENALTY_CONTEXT
from kit.engine.types import EngineError

log = logging.getLogger("mlx_kit.engine")


def serve_alone(pipeline: Pipeline, job: Job,
                join: Callable[[], bool] | None = None) -> Joined | None:
    """Run ``job`` alone, posting its events and END (errors are posted, never raised).

    Args:
        join: when given, asked once the request is prepared and after each token;
            True (a request waits) stops it and returns the state a batch continues
            from (before the prefill: the batch prefills it with the others). Only for
            requests that can move (a trimmable KV cache and no grammar, see
            :meth:`kit.engine.decode.engine.Engine`'s scheduler).

    Returns:
        The :class:`Joined` state (END not posted yet: the batch posts it), or None.
    """
    if not pipeline.admit(job):
        return None
    return _posting(pipeline, job, lambda: decode(pipeline, job, join))


def _posting(pipeline: Pipeline, job: Job,
             body: Callable[[], Joined | None]) -> Joined | None:
    """Run ``body`` for ``job``; unless it returns the state a batch continues from, end
    the job: its error posted (never raised), its memory given back, END posted."""
    try:
        joined = body()
        if joined is not None:
            return joined
    except EngineError as e:
        job.post(e)
    except Exception as e:
        log.exception("generation failed for %s", job.request.request_id)
        pipeline.fatal(e)
        job.post(EngineError(f"generation failed: {e}"))
    pipeline.admission.release(job)  # whatever path ended it (complete released it too)
    job.post(END)
    return None


def decode(pipeline: Pipeline, job: Job, join: Callable[[], bool] | None) -> Joined | None:
    """Prepare ``job``, decode it with ``mlx_lm.stream_generate`` and complete it.

    With ``join``, when it says another request waits (already once the request is
    prepared: then the batch prefills its prompt with the others'), stop after the
    current token and return the state a batch continues from: the KV cache trimmed by
    that token, which the batch feeds again (stream_generate has already fed it to
    compute the next one), and a detokenizer that has seen the tokens so far (a grammar's llguidance matcher would
    have consumed the last token already: constrained requests never join).

    Raises:
        EngineError: the request cannot run (before ``Started``) or generation failed.
    """
    if pipeline.slot.vision:  # mlx-vlm decodes it (kit.engine.decode.vision); never joins
        vision_decode.decode(pipeline, job)
        return None
    drafts = pipeline.slot.drafts
    draft = drafts.usable(job.request) if drafts is not None else None
    # running=False: nothing else decodes here, so admission never defers this request
    # (Deferred cannot come out of it): its prompt fits, or it is refused with the 400
    run = pipeline.prepare(job, running=False, draft=draft)
    model, tokenizer = pipeline.slot.model, pipeline.slot.tokenizer
    if join is not None and draft is None:
        pipeline.sync()  # what arrived while it was prepared (a sync point, as a token is)
        if join():  # they prefill together in the batch, not after this one's prefill
            log.debug("%s: joins a batch before its prefill", job.request.request_id)
            return Joined(run, run.prompt[:run.cached], list(run.rest),
                          tokenizer.detokenizer)

    def check_cancelled(_done: int, _total: int) -> None:
        pipeline.sync()  # a prefill chunk is a sync point of a distributed engine
        if job.cancelled.is_set():  # the client left during prefill: stop it there
            raise Cancelled

    processors = with_context(run, run.prompt[:run.cached])
    step = compiled_step(pipeline, run) if draft is None else None
    if draft is None:
        stream = mlx_lm_api.stream_generate(step or model, tokenizer, run.rest,
                                 max_tokens=run.max_tokens, sampler=run.sampler,
                                 logits_processors=processors, prompt_cache=run.cache,
                                 prompt_progress_callback=check_cancelled,
                                 prefill_step_size=prefill_step_size())
    else:  # mlx-lm's speculative decode takes no progress callback: a prefill runs whole
        stream = speculative_stream(model, tokenizer, draft, run.rest,
                                    drafts.num_draft_tokens, run.max_tokens,
                                    sampler=run.sampler, logits_processors=processors,
                                    prompt_cache=run.cache,
                                    prefill_step_size=prefill_step_size())
    try:
        first = next(stream, None)
    except Cancelled:  # the KV cache is half-filled: do not keep it
        log.info("%s: cancelled during prefill", job.request.request_id)
        pipeline.complete(run, "cancelled", [], None)
        return None
    return _generate(pipeline, run, stream, [first] if first is not None else [],
                     list(run.prompt), join, draft=draft, step=step)


def resume(pipeline: Pipeline, joined: Joined, join: Callable[[], bool]) -> Joined | None:
    """Continue alone a request that a batch handed back (the other rows finished and
    none waits: one stream decodes faster on ``stream_generate`` than on
    ``BatchGenerator``), posting its events and END as :func:`serve_alone` does.

    Args:
        joined: the request's state: ``run.cache`` holds ``held`` (its prompt and every
            generated token but the last), ``feed`` (that last token) is fed next,
            ``detok`` has seen every generated token.
        join: asked after each token; True stops it again for a batch (see :func:`decode`).

    Returns:
        The :class:`Joined` state a batch continues from, or None (END posted).
    """
    return _posting(pipeline, joined.run.job, lambda: _resume(pipeline, joined, join))


def _resume(pipeline: Pipeline, joined: Joined, join: Callable[[], bool]) -> Joined | None:
    run = joined.run
    model, tokenizer = pipeline.slot.model, pipeline.slot.tokenizer
    processors = with_context(run, joined.held)
    step = compiled_step(pipeline, run)
    stream = mlx_lm_api.stream_generate(step or model, tokenizer, joined.feed,
                                        max_tokens=run.max_tokens - run.n,
                                        sampler=run.sampler, logits_processors=processors,
                                        prompt_cache=run.cache,
                                        prefill_step_size=prefill_step_size())
    log.debug("%s: decodes alone again after %d tokens", run.job.request.request_id, run.n)
    return _generate(pipeline, run, stream, [], joined.held + joined.feed, join,
                     step=step, detok=joined.detok)


def with_context(run: Run, held: list[int]) -> list:
    """``run``'s logits processors, penalties lent the last tokens of ``held`` (what the
    KV cache holds before this call): stream_generate shows processors only the tokens
    it is given (+ generated), and penalties look at the last 20, as a batch does (the
    same text whatever was cached, batched or handed back)."""
    params = run.job.request.params
    if not held or not (params.presence_penalty or params.frequency_penalty):
        return run.processors
    import mlx.core as mx

    before = mx.array(held[-PENALTY_CONTEXT:])
    return [lambda tokens, logits, p=p: p(mx.concatenate([before, tokens]), logits)
            for p in run.processors]


def compiled_step(pipeline: Pipeline, run: Run) -> Any:
    """The compiled decode step's stand-in for the model (:mod:`kit.engine.decode.compiled`)
    when ``run`` may use it, its caches then in ``run.cache``; else None."""
    model = pipeline.slot.model
    if not compiled.usable(model, run.cache, enabled=pipeline.slot.compile_decode):
        return None
    step = compiled.CompiledModel(model, run.cache)
    run.cache = step.caches
    return step


def _generate(pipeline: Pipeline, run: Run, stream: Any, head: list, tokens: list[int],
              join: Callable[[], bool] | None, *, draft: Any = None, step: Any = None,
              detok: Any = None) -> Joined | None:
    """Post ``run``'s tokens from ``stream`` (``head``: those already taken from it) and
    complete it, or stop when ``join`` says a request waits and return the state a batch
    continues from. ``tokens``: what the KV cache will hold before the first new token
    (appended to). ``detok``: a detokenizer to take the text from instead of the
    stream's (a resumed request's)."""
    import mlx.core as mx

    job = run.job
    drafts = pipeline.slot.drafts
    tokenizer = pipeline.slot.tokenizer
    finish_reason = "stop"
    from_draft: list[bool] = []
    for gen in itertools.chain(head, stream):
        run.token(gen.token, gen.logprobs)
        tokens.append(gen.token)
        from_draft.append(gen.from_draft)
        run.emit(run.parser.feed(gen.text if detok is None else
                                  next_text(detok, gen.token, gen.finish_reason)))
        if run.parser.stopped:
            break
        pipeline.sync()  # what rank 0 saw since the last token (cancels, arrivals)
        if job.cancelled.is_set():
            finish_reason = "cancelled"
            break
        if gen.finish_reason is not None:
            finish_reason = gen.finish_reason
            break
        if join is not None and run.n < run.max_tokens and join():
            stream.close()
            if step is not None:
                run.cache = step.kv_caches()
            if draft is not None:
                drafts.count(from_draft)
                run.cache, run.cache_key = target_part(run.cache, draft), None
            mx.eval([c.state for c in run.cache])
            # the batch feeds the last token again: the cache holds all tokens but it
            mlx_lm_api.trim_prompt_cache(run.cache, run.cache[0].offset - (len(tokens) - 1)
                                         if draft is not None else 1)
            if detok is None:
                detok = tokenizer.detokenizer
                for token in tokens[len(run.prompt):]:
                    detok.add_token(token)
                detok.last_segment  # noqa: B018 (sent already, through stream_generate's)
            log.debug("%s: joins a batch after %d tokens", job.request.request_id, run.n)
            return Joined(run, tokens[:-1], tokens[-1:], detok)
    if step is not None:
        stream.close()
        run.cache = step.kv_caches()
    if draft is not None:
        stream.close()  # mlx-lm's rewind of both caches, before they are stored
        drafts.count(from_draft)
        tokens = aligned(run.cache, draft, tokens)
    pipeline.complete(run, finish_reason, tokens, run.cache)
    return None
