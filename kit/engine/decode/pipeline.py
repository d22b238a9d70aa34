"""The request pipeline both decode paths share: :meth:`Pipeline.prepare` (everything
before the first token) and :meth:`Pipeline.complete` (everything after the last),
with the prompt cache behind :class:`PromptCachePolicy`.

Sequential decode (:mod:`kit.engine.decode.sequential`) and batching (:mod:`kit.engine.decode.batch`)
only generate tokens between the two calls. A distributed engine's followers would
mirror exactly this: the same prepare (same prompt, same cache lookup) and complete (same
cache insert and next-turn prefill), so every rank's KV caches stay the same.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from kit import mlx_lm_api
from kit.engine.cache.admission import Admission, Deferred, Room
from kit.engine.cache.policy import PromptCachePolicy
from kit.engine.decode.bridge import END
from kit.engine.decode.draft import DRAFT_SEPARATOR, draft_part, target_part
from kit.engine.decode.prefill import prefill_step_size
from kit.engine.decode.prompt import Prompts
from kit.engine.decode.run import Job, Run
from kit.engine.decode.sampling import Sampling, max_tokens
from kit.engine.decode.vision import VisionCaches, media_token_counts
from kit.engine.decode.slot import ModelSlot
from kit.engine.types import Finished, InvalidRequest, Started, Usage
from kit.formats.output import OutputParser
from kit.models.adapters import SEPARATOR as ADAPTER_SEPARATOR
from kit.models.memory import human

log = logging.getLogger("mlx_kit.engine")


class Pipeline:
    """Prepare and complete requests for the model in ``slot``.

    Args:
        slot: the model.
        cache: the prompt-cache policy.
        servable: the engine's ``job -> bool``: get the model ready for the job (reload it
            after an idle unload) or post the error and END and return False.
        served: called once a request is counted as served, before its ``Finished``.

    Attributes:
        admission: memory admission (:mod:`kit.engine.cache.admission`): every request
            reserves its KV cache from :meth:`prepare` to :meth:`complete`.
        changed: called when admission refused or first deferred a request (its
            counters changed with no request served); the engine sets it to its
            ``on_change``.
    """

    #: The share of the memory left after the weights that the in-memory prompt caches
    #: may hold when ``--prompt-cache-bytes`` is not given.
    CACHE_SHARE = 4

    def __init__(self, slot: ModelSlot, cache: PromptCachePolicy,
                 servable: Callable[[Job], bool], served: Callable[[], None]) -> None:
        self.slot = slot
        self.prompts = Prompts(slot)
        self.sampling = Sampling(slot)
        self.cache = cache
        self.vision_caches = VisionCaches()  # a vision model's (kit.engine.decode.vision)
        self.admission = Admission()
        self.changed: Callable[[], None] = lambda: None
        cache.default_bytes = self._default_cache_bytes
        self.reclaim = False  # a large prompt was prepared: give memory back when idle
        self.sync: Callable[[], None] = lambda: None  # the engine's Inbox.sync
        self.fatal: Callable[[BaseException], None] = lambda error: None  # Engine's on_fatal
        self._servable, self._served = servable, served

    def admit(self, job: Job) -> bool:
        """Whether ``job`` should run now: not cancelled (else it is ended) and servable
        (see ``servable``)."""
        if job.cancelled.is_set():
            self.admission.release(job)  # it may have waited for memory: forget it
            job.post(END)
            return False
        if not self._servable(job):
            self.admission.release(job)
            return False
        return True

    def _reclaim_later(self) -> None:
        self.reclaim = True  # given back once the worker is idle

    def prepare(self, job: Job, running: bool = False, draft: Any = None) -> Run:
        """Everything before the first token: sampling checks, chat template, context
        check, constraint, sampler, prompt-cache lookup; posts ``Started``.

        Args:
            running: other requests decode now (a batch with active rows): only then may
                admission defer this one (see :meth:`Admission.admit`).
            draft: the :class:`kit.engine.decode.draft.LoadedDraft` it decodes with: its
                cache holds the draft's layers after the model's, filed under a key of
                its own (memory tier only).

        Raises:
            Deferred: only with ``running``: it fits once a running request completes.
            InvalidRequest: bad sampling parameters, the template rejects the messages,
                the context is exceeded, or the constraint does not compile.
        """
        req, params = job.request, job.request.params
        t0 = time.perf_counter()
        self.sampling.check(params)
        prompt, media = self.prompts.prompt(req, params.max_tokens,
                                            on_large=self._reclaim_later)
        grammar, forced, source = self.prompts.constraint(req, prompt)
        prompt += forced
        n_max = max_tokens(self.slot.info, len(prompt), params.max_tokens)
        sampler, processors = self.sampling.build(params, grammar, source)
        # each adapter's KV is its own: the prompt cache keys it apart, and the report
        # names the model and the adapter (kit.engine.decode.adapters)
        key = self.slot.info.id if req.adapter is None else \
            f"{self.slot.info.id}{ADAPTER_SEPARATOR}{req.adapter}"
        # a new cache is quantized from its first token with --kv-bits (kit.engine.cache.kv), so
        # cached ones are too: a prefix hit continues in the same precision as a cold run
        cache_key = None  # the prompt cache's key when not ``key`` (a drafted request's)
        if self.slot.vision:  # mlx-vlm's own cache per set of images (kit.engine.decode.vision)
            cache, rest = None, prompt
            media_key = VisionCaches.key(key, req.images, req.audio)
            cached = self.vision_caches.reused(media_key, prompt, self.slot.model.config)
        elif draft is not None:
            cache_key = f"{key}{DRAFT_SEPARATOR}{draft.info.id}"
            cache, rest = self.cache.fetch(
                cache_key, prompt, lambda: self.slot.new_cache() + self.slot.new_cache(
                    draft.model), disk=False)
            cached = len(prompt) - len(rest)
        else:
            cache, rest = self.cache.fetch(key, prompt, self.slot.new_cache,
                                           disk=req.adapter is None)
            cached = len(prompt) - len(rest)
        tok = self.slot.tokenizer
        parser = OutputParser(stops=params.stop) if req.raw else OutputParser.for_format(
            self.slot.output_format, self.prompts.tail_text(prompt), stops=params.stop,
            tools=req.tools, in_tool_call=req.force_tool is not None and bool(forced),
            tokenizer=tok, parallel=req.parallel_tool_calls)
        waited = self.admission.deferred
        try:  # the last step that may refuse it: nothing after it can fail (no leak)
            n_max, asked = self.admission.admit(job, req.request_id, len(prompt), n_max,
                                                self.room(), running=running,
                                                sent=params.max_tokens is not None)
        except InvalidRequest:
            self.changed()  # /health's counters, at once (no request is served)
            raise
        except Deferred:
            if self.admission.deferred > waited:  # counted once per request
                self.changed()
            raise
        # the engine's order of starts and ends in the log (the completion's INFO line is
        # the other end): where requests arrive apart or wait at a barrier. Worded apart
        # from that line's "prompt N tokens (M cached)", which tools read once a request
        log.debug("%s: starts: %s, %d of its %d prompt tokens cached%s", req.request_id,
                  key, cached, len(prompt), ", beside others" if running else "")
        job.post(Started(key, len(prompt), cached, n_max, asked))
        return Run(job, key, prompt, rest, cache, cached, n_max, sampler, processors, parser,
                   t0, logprob=self.sampling.logprob if params.logprobs else None,
                   media=media, cache_key=cache_key)

    def complete(self, run: Run, finish_reason: str, tokens: list[int], cache: Any,
                 prefill_next: bool = True) -> None:
        """After the last token: flush the parser, post ``Finished``, then store the prompt
        cache (``tokens``: what ``cache`` holds; ``cache`` None: nothing worth keeping),
        fitted to what the next turn will resend (:meth:`PromptCachePolicy.next_turn`).
        ``prefill_next`` False fits it by trimming only: a batch passes it while other rows
        decode, which would wait for the fitting's prefill (a whole answer where a template
        drops the reasoning, or where the text re-tokenizes otherwise); the next turn
        prefills those tokens itself. The caller posts END."""
        self.admission.release(run.job)
        run.emit(run.parser.finish(finish_reason))
        if finish_reason == "stop" and run.parser.tool_calls:
            finish_reason = "tool_calls"
        n_images, n_audio = len(run.job.request.images), len(run.job.request.audio)
        image_tokens, audio_tokens = media_token_counts(run.prompt, self.slot.model.config) \
            if self.slot.vision and (n_images or n_audio) else (0, 0)
        usage = Usage(len(run.prompt), run.n, run.cached,
                      min(run.parser.reasoning_tokens, run.n), image_tokens, audio_tokens)
        tps = (run.n - 1) / (time.perf_counter() - run.first_at) if run.n > 1 else 0.0
        media = (f", {n_images} image{'s' * (n_images != 1)}" if n_images else "") + \
            (f", {n_audio} audio clip{'s' * (n_audio != 1)}" if n_audio else "")
        log.info("%s: %s, prompt %d tokens (%d cached)%s, generated %d, ttft %.3f s, "
                 "%.1f tok/s, %s", run.job.request.request_id, run.key, usage.prompt_tokens,
                 run.cached, media, run.n, run.ttft, tps, finish_reason)
        text = "".join(run.texts)
        log.debug("%s: text %r", run.job.request.request_id, text)
        self._served()  # before the client can see the end (and ask /health)
        run.job.post(Finished(finish_reason, usage, run.key, run.ttft, tps,
                              run.parser.stop_string))
        if cache is None:
            return
        if finish_reason != "cancelled" and not run.job.request.raw:
            tokens = self._next_turn(run, tokens, cache, text, prefill_next)
        self.cache.insert(run.cache_key or run.key, tokens, cache,
                          disk=run.job.request.adapter is None and run.cache_key is None)

    def room(self) -> Room | None:
        """What memory admission checks a request against (None: no estimate of the
        loaded model, or a distributed rank, where each machine's memory differs and the
        ranks must decide alike: admission is off there, see docs/distributed.md)."""
        slot = self.slot
        if slot.split is not None or slot.ceiling is None or slot.kv_per_token <= 0:
            return None
        return Room(slot.ceiling.bytes, slot.ceiling.source, slot.weights_bytes,
                    slot.kv_per_token, self.cache.nbytes, self.cache.evict)

    def _default_cache_bytes(self) -> int | None:
        """The prompt caches' byte bound when ``--prompt-cache-bytes`` is not given: a
        quarter of what the ceiling leaves after the weights (logged); None (no byte
        bound, entries only) without an estimate or on a distributed rank (each rank's
        share of a cache has its own size: a byte bound would evict differently on each)."""

        slot = self.slot
        if slot.split is not None or slot.ceiling is None:
            return None
        share = max(0, slot.ceiling.bytes - slot.weights_bytes) // self.CACHE_SHARE
        log.info("prompt cache: up to %d caches, %s (1/%d of the %s ceiling less %s of "
                 "weights)", self.cache.size, human(share), self.CACHE_SHARE,
                 slot.ceiling.label, human(slot.weights_bytes))
        return share

    def memory_snapshot(self) -> dict[str, Any]:
        """Admission's counters (:meth:`Admission.snapshot`) with the ceiling and the
        in-memory prompt caches' bytes, entries and byte bound: ``/health``'s
        ``admission``."""
        ceiling = self.slot.ceiling
        return {**self.admission.snapshot(),
                "ceiling_bytes": ceiling.bytes if ceiling else None,
                "ceiling_source": ceiling.source if ceiling else None,
                "prompt_cache_bytes": self.cache.nbytes(),
                "prompt_cache_entries": self.cache.entries(),
                "prompt_cache_max_bytes": self.cache.byte_bound()}

    def _next_turn(self, run: Run, tokens: list[int], cache: Any, text: str,
                   prefill_next: bool = True) -> list[int]:
        """The next turn's rendering of this conversation (``text``: the answer), then
        :meth:`PromptCachePolicy.next_turn` (any template failure: ``tokens`` as is)."""
        req = run.job.request
        message = resent_turn(text, run.calls)
        try:
            resend = self.prompts.render(req, req.messages + [message],
                                         generation_prompt=False)
        except Exception as e:  # any template failure: keep the cache as generated
            log.debug("%s: no next-turn cache (%s)", req.request_id, e)
            return tokens
        refilled: list[int] = []

        def prefill(c: Any, rest: list[int]) -> None:
            refilled.append(len(rest))
            self._prefill(c, rest)

        kept = self.cache.next_turn(tokens, resend, len(run.prompt), cache,
                                    prefill if prefill_next else None)
        if not prefill_next and kept is not tokens:
            log.debug("%s: cached %d tokens of the next turn's prefix (it prefills the "
                      "other %d: requests decode beside it)", req.request_id, len(kept),
                      len(resend) - len(kept))
        if refilled:
            log.debug("%s: cached the next turn's prefix: %d tokens (%d re-rendered)",
                      req.request_id, len(resend), refilled[0])
        return kept

    def _prefill(self, cache: Any, tokens: list[int]) -> None:
        """Run the model over ``tokens`` into ``cache`` (chunked, on mlx-lm's stream); a
        drafted request's cache (the draft's layers after the model's,
        :mod:`kit.engine.decode.draft`) gets them in both models."""
        import mlx.core as mx
        parts = [(self.slot.model, cache)]
        draft = self.slot.drafts.loaded if self.slot.drafts is not None else None
        if draft is not None and len(cache) == len(self.slot.model.layers) + draft.layers:
            parts = [(self.slot.model, target_part(cache, draft)),
                     (draft.model, draft_part(cache, draft))]
        step = prefill_step_size()
        with mx.stream(mlx_lm_api.generation_stream):  # the stream mlx-lm generates on (GPU: no hops)
            for model, part in parts:
                for i in range(0, len(tokens), step):
                    model(mx.array(tokens[i:i + step])[None], cache=part)
                    mx.eval([c.state for c in part])


def resent_turn(text: str, calls: list[Any]) -> dict[str, Any]:
    """The assistant turn of answer ``text`` and ``calls`` (:class:`ToolCall`) as a client
    resends it, after every protocol's translation (kit/server/translate.py): content ""
    beside calls (not None: gpt-oss's template fails on ``"..." in None``), arguments a
    mapping (gpt-oss's template writes ``arguments|tojson``: a JSON string would come out
    quoted), no reasoning (OpenAI clients resend none)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.name, "arguments": _mapping(c.arguments)}} for c in calls]
    return message


def _mapping(arguments: str) -> Any:
    """A generated call's arguments (a JSON string) as the mapping history carries (text
    that is not JSON as it is), like ``kit.server.translate.tool_arguments``."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return arguments
