"""Continuous batching: several requests decode together on mlx-lm's ``BatchGenerator``.

The engine's worker calls :func:`run_batch` (``max_batch > 1``) when a request arrives
while others wait, or when one that was decoding alone (``stream_generate``, faster for a
single stream) sees another arrive: that one moves in with its KV cache. It admits every
request already queued and keeps admitting new ones while the batch runs (each is
prepared like a sequential one: template, context check, prompt-cache lookup), and
returns when no request is left, or when a swap, the shutdown or a request for another
LoRA adapter is next in the queue (a barrier: the batch finishes first, so a swap still
fails no request, and one batch never mixes adapters).

Per request: a streaming detokenizer, the output parser (stop strings, reasoning, tool
calls), cancellation (the sequence is removed from the batch at once, in prefill too),
and at the end its KV cache goes to the prompt cache. The batch structure follows how
``mlx_lm.server`` drives ``BatchGenerator``.
"""

from __future__ import annotations

import logging
import queue
from collections import deque
from collections.abc import Callable
from typing import Any

from kit import mlx_lm_api
from kit.engine.cache.admission import Deferred
from kit.engine.decode.bridge import END
from kit.engine.decode.inbox import Inbox, is_job
from kit.engine.decode.pipeline import Pipeline
from kit.engine.decode.prefill import prefill_step_size
from kit.engine.decode.run import Job, Joined, Run
from kit.engine.types import EngineError

log = logging.getLogger("mlx_kit.engine")


def run_batch(pipeline: Pipeline, first: Job | None, jobs: Inbox, max_batch: int,
              joined: Joined | None = None, queued: deque | None = None,
              alone: Callable[[Joined, Callable[[], bool]], Joined | None] | None = None
              ) -> deque:
    """Serve ``first`` (and ``joined``, a request that started alone, see
    :func:`kit.engine.decode.sequential.decode`) and every request that joins while the batch
    runs, at most ``max_batch`` decoding together. ``queued``: the worker's items taken
    earlier and not served yet (emptied here), ahead of the inbox's in the line, so a
    request that waited at a barrier keeps its place. ``alone``: when given, a batch
    down to one request that can move (see :func:`movable`), with none waiting, hands it
    to ``alone(state, join)`` (:func:`kit.engine.decode.sequential.resume`: one stream is
    faster on ``stream_generate``), which returns it again (a :class:`Joined`) when a
    request arrives, or None once it is done. ``jobs`` is the engine's
    :class:`kit.engine.decode.inbox.Inbox` (:class:`Job`, :class:`kit.engine.decode.run.Swap` or None for
    the shutdown; each pass of the loop is one of its sync points); every job
    served gets its events and END posted.

    Returns:
        Queue items taken but not served here (a swap or the shutdown marker, and what
        followed them), for the worker to handle next, in order.
    """
    model, tokenizer = pipeline.slot.model, pipeline.slot.tokenizer
    backlog: deque = deque([first] if first is not None else [])
    if queued:
        backlog.extend(queued)
        queued.clear()
    active: dict[int, tuple[Run, Any]] = {}
    stops = mlx_lm_api.make_stop_sequences(tokenizer)  # EOS; stop strings are text-level
    bg = mlx_lm_api.BatchGenerator(model, completion_batch_size=max_batch,
                        prefill_batch_size=min(max_batch, 8),
                        prefill_step_size=prefill_step_size())

    # (a request waiting for memory, admission.released when it last tried), or None
    waiting: tuple[Job, int] | None = None
    # one adapter for the whole model (kit.engine.decode.adapters): a request for another
    # one is a barrier, served once this batch is done
    adapter = (first.request if first is not None else joined.run.job.request).adapter

    def finish(uid: int, reason: str, tokens: list[int] | None, cache: Any) -> None:
        run, _ = active.pop(uid)
        try:  # no next-turn prefill while other rows decode: they would wait for it
            pipeline.complete(run, reason, tokens or [], cache if tokens else None,
                              prefill_next=not active)
        finally:
            run.job.post(END)

    def not_inserted(job: Job, e: Exception) -> None:
        """``job`` was prepared (memory reserved, ``Started`` posted) but the batch would
        not take it: give its reservation back and end its stream with the error (a leaked
        reservation would make every later request wait for memory)."""
        log.exception("%s: could not join the batch", job.request.request_id)
        pipeline.admission.release(job)
        pipeline.fatal(e)
        job.post(e if isinstance(e, EngineError) else EngineError(f"generation failed: {e}"))
        job.post(END)

    def take(joined: Joined) -> None:
        """Continue ``joined`` in the batch: a request that decoded alone, or one that
        moved before its prefill (its prompt's rest prefills here)."""
        run = joined.run
        try:
            (uid,) = bg.insert([joined.feed], max_tokens=[run.max_tokens - run.n],
                               caches=[run.cache], all_tokens=[joined.held],
                               samplers=[run.sampler], logits_processors=[run.processors],
                               stop_sequences=[stops])
        except Exception as e:  # it fails alone; the queued requests still run
            not_inserted(run.job, e)
        else:  # in `decoding` from its first token on: until then the batch holds it
            active[uid] = (run, joined.detok)  # unprocessed, its cache without `feed`
        run.cache = None

    def hand_back() -> bool:
        """Give the batch's one request back to ``alone``; whether it was."""
        (uid, (run, detok)), = active.items()
        if alone is None or backlog or not jobs.empty() or uid not in decoding \
                or uid in stays or run.job.cancelled.is_set() or not movable(pipeline, run):
            return False
        (cache, held), = bg.extract_cache([uid]).values()
        # a row being generated holds its prompt and every token it returned, all fed
        if cache[0].offset != len(held) or len(held) != len(run.prompt) + run.n:
            # not the state this hand-over knows: stay
            log.warning("%s: batch cache of %d tokens for %d: not handed back",
                        run.job.request.request_id, cache[0].offset, len(held))
            stays.add(uid)
            return False
        bg.remove([uid])
        del active[uid]
        # every token returned so far is in the cache: feed the last one again (as a
        # request moving in from alone does), which samples the token the batch had
        # computed ahead and dropped
        mlx_lm_api.trim_prompt_cache(cache, 1)
        run.cache = cache
        held = list(held)
        back = alone(Joined(run, held[:-1], held[-1:], detok),
                     lambda: is_job(backlog[0], adapter) if backlog else
                     jobs.next_is_job(adapter))
        if back is not None:
            take(back)
        return True

    admitted = False  # the loop's last pass put a request in the batch
    decoding: set[int] = set()  # rows past their prefill (they have sent a token)
    stays: set[int] = set()  # rows whose state the hand-back did not recognise
    try:
        if joined is not None:
            take(joined)
        while True:
            jobs.sync()
            admitted = False
            while True:  # admit what is queued, up to a barrier
                try:
                    backlog.append(jobs.get_nowait())
                except queue.Empty:
                    break
            while backlog and is_job(backlog[0], adapter):
                job = backlog.popleft()
                if not pipeline.admit(job):
                    continue
                if active and waiting and waiting[0] is job and \
                        waiting[1] == pipeline.admission.released:
                    backlog.appendleft(job)  # no memory came back since it last tried
                    break
                try:  # only with rows decoding may it wait for memory (else: the 400)
                    run = pipeline.prepare(job, running=bool(active))
                except Deferred:  # it waits (first in line) until a running one completes
                    waiting = (job, pipeline.admission.released)
                    backlog.appendleft(job)
                    break
                except Exception as e:  # this request fails alone; the batch goes on
                    if not isinstance(e, EngineError):
                        log.exception("%s: could not start", job.request.request_id)
                        pipeline.fatal(e)
                        e = EngineError(f"generation failed: {e}")
                    job.post(e)
                    job.post(END)
                    continue
                waiting = None
                try:
                    (uid,) = bg.insert([run.rest], max_tokens=[run.max_tokens],
                                       caches=[run.cache], all_tokens=[run.prompt[:run.cached]],
                                       samplers=[run.sampler], logits_processors=[run.processors],
                                       stop_sequences=[stops])
                except Exception as e:  # this request fails alone; the batch goes on
                    not_inserted(job, e)
                    run.cache = None
                    continue
                active[uid] = (run, tokenizer.detokenizer)
                run.cache = None  # the batch owns it now
                admitted = True
            if admitted and len(active) < max_batch:
                # requests that reached the engine while these were prepared (template,
                # tokens, cache lookup) join them before the step: one prefill for all,
                # not one now and one after it; the loop's top syncs and admits them
                continue
            if len(active) == 1 and hand_back():
                continue
            if not active:
                return backlog
            prompt_responses, gen_responses = bg.next()
            gone = [r.uid for r in prompt_responses
                    if r.uid in active and active[r.uid][0].job.cancelled.is_set()]
            if gone:
                bg.remove(gone)
                for uid in gone:
                    log.info("%s: cancelled during prefill", active[uid][0].job.request.request_id)
                    finish(uid, "cancelled", None, None)
            for r in gen_responses:
                if r.uid not in active:
                    continue
                decoding.add(r.uid)
                run, detok = active[r.uid]
                run.token(r.token, r.logprobs)
                run.emit(run.parser.feed(next_text(detok, r.token, r.finish_reason)))
                if r.finish_reason is not None:
                    finish(r.uid, r.finish_reason, r.all_tokens, r.prompt_cache)
                elif run.parser.stopped or run.job.cancelled.is_set():
                    reason = "stop" if run.parser.stopped else "cancelled"
                    cache, key = bg.remove([r.uid], return_prompt_caches=True)[r.uid]
                    finish(r.uid, reason, list(key), cache)
    except Exception as e:
        log.exception("batched generation failed")
        pipeline.fatal(e)
        for uid in list(active):
            run, _ = active.pop(uid)
            pipeline.admission.release(run.job)
            run.job.post(EngineError(f"generation failed: {e}"))
            run.job.post(END)
        return backlog
    finally:
        bg.close()


def next_text(detok: Any, token: int, finish_reason: str | None) -> str:
    """Feed ``token`` to ``detok`` (mlx-lm's streaming detokenizer) and return the text it
    completes; the end token (``finish_reason`` "stop") is not part of the text, and the
    last token flushes what the detokenizer held back. A request resumed alone reads its
    text here too, from the detokenizer that saw its earlier tokens (a fresh one would
    break a character split across the hand-over)."""
    if finish_reason == "stop":
        detok.finalize()
    else:
        detok.add_token(token)
        if finish_reason is not None:
            detok.finalize()
    return detok.last_segment


def movable(pipeline: Pipeline, run: Run) -> bool:
    """Whether ``run`` may leave a batch to decode alone (and come back): no grammar (a
    constrained request's matcher has consumed the token the hand-over feeds again), a
    KV cache that can be trimmed, one process (a distributed engine's ranks would have
    to decide it in lockstep)."""
    req = run.job.request
    return (req.force_tool is None and req.response_schema is None
            and pipeline.slot.split is None and pipeline.slot.trimmable())
