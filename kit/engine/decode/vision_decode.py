"""A vision model's decode: one request alone on ``mlx_vlm.stream_generate`` (see
:mod:`kit.engine.decode.vision`), between the text path's
:meth:`~kit.engine.decode.pipeline.Pipeline.prepare` and
:meth:`~kit.engine.decode.pipeline.Pipeline.complete`."""

from __future__ import annotations

import logging

from kit.engine.decode.pipeline import Pipeline
from kit.engine.decode.prefill import prefill_step_size
from kit.engine.decode.run import Job
from kit.engine.decode.vision import VisionCaches

log = logging.getLogger("mlx_kit.engine")


def decode(pipeline: Pipeline, job: Job) -> None:
    """Prepare ``job``, decode it with ``mlx_vlm.stream_generate`` (the prompt's image
    features, the request's sampler and logits processors, the conversation's
    ``PromptCacheState``) and complete it. The caller posts END.

    A cancelled request stops at the next token (mlx-vlm's prefill has no progress hook:
    a prompt already prefilling runs to its end first). A generation that stops before
    mlx-vlm finishes it (a cancel, a stop string, an error) drops its cache state, whose
    KV no longer matches the tokens it records.

    Raises:
        EngineError: the request cannot run (before ``Started``) or generation failed.
    """
    from mlx_vlm import stream_generate

    run = pipeline.prepare(job, running=False)
    slot, caches = pipeline.slot, pipeline.vision_caches
    key = VisionCaches.key(run.key, job.request.images, job.request.audio)
    config = slot.model.config
    state = caches.state(key, run.prompt, config)
    media = dict(run.media or {})
    import mlx.core as mx

    stream = stream_generate(
        slot.model, slot.processor, "", input_ids=mx.array([run.prompt]),
        pixel_values=media.pop("pixel_values", None), mask=media.pop("mask", None),
        max_tokens=run.max_tokens, sampler=run.sampler, logits_processors=run.processors,
        prompt_cache_state=state, prefill_step_size=prefill_step_size(), **media)
    tokens = list(run.prompt)
    finish_reason, whole = "stop", False
    try:
        for gen in stream:
            if gen.finish_reason is not None:
                # the last result: the detokenizer's flushed tail; its token is the end
                # token (a stop) or the last one again (the length cap)
                if gen.finish_reason == "stop" and gen.token is not None:
                    run.token(int(gen.token), gen.logprobs)
                    tokens.append(int(gen.token))
                if gen.text:
                    run.emit(run.parser.feed(gen.text))
                # a stop string the held-back tail completed ends it as a stop
                finish_reason = "length" if gen.finish_reason == "length" and \
                    not run.parser.stopped else "stop"
                whole = not run.parser.stopped
                break
            if run.n == 0:
                run.cached = gen.cached_tokens  # what mlx-vlm reused, as it decided
            run.token(int(gen.token), gen.logprobs)
            tokens.append(int(gen.token))
            run.emit(run.parser.feed(gen.text))
            if run.parser.stopped:
                break
            if job.cancelled.is_set():
                finish_reason = "cancelled"
                break
        if whole:
            for _ in stream:  # mlx-vlm records the turn in the cache state after its last
                pass
    finally:
        stream.close()
        if not whole:
            caches.drop(key)
    pipeline.complete(run, finish_reason, tokens, None)
