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
from kit.engine.decode.bridge import END
from kit.engine.decode.prefill import prefill_step_size
from kit.engine.decode.prompt import Prompts
from kit.engine.decode.run import Job, Run
from kit.engine.decode.sampling import Sampling, max_tokens
from kit.engine.decode.slot import ModelSlot
from kit.engine.types import Finished, InvalidRequest, Started, Usage
from kit.formats.output import OutputParser
from kit.models.memory import human

log = logging.getLogger("mlx_kit.engine")


def reusable_prefix(resend: list[int], tokens: list[int], n_prompt: int) -> int | None:
    """How many of ``tokens`` (what a KV cache holds: prompt + generated) the next turn,
    which resends the conversation as ``resend``, can keep: the common prefix, or None
    when trimming would not help (``tokens`` already starts with all of ``resend``, or
    the template rewrote the prompt itself: less than half of its ``n_prompt`` tokens
    in common)."""
    common = 0
    for a, b in zip(resend, tokens):
        if a != b:
            break
        common += 1
    if common == len(resend) or common < n_prompt // 2:
        return None
    return common


class PromptCachePolicy:
    """Which KV cache a prompt starts from and which one is kept after it: mlx-lm's
    ``LRUPromptCache`` (longest cached prefix, ``size`` entries) plus two rules of ours:
    an exact hit re-feeds the last prompt token (its logits are not cached), and a
    finished turn's cache is fitted to what the next turn resends (:meth:`next_turn`).

    With a disk tier (:meth:`attach_disk`, :mod:`kit.engine.cache.disk_tier`), a prompt that
    memory serves less of than a file on disk starts from that file, and every kept cache
    of 256 tokens or more is queued for the disk, written when the worker is idle
    (:meth:`write_pending`).

    Args:
        size: how many caches to keep.
        max_bytes: most bytes the kept caches may hold together (least recently used
            evicted first); None: ``default_bytes()`` when the store is made (after each
            load: the owner sets it to a share of the memory left after the weights).
    """

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.default_bytes: Callable[[], int | None] = lambda: None  # None: no byte bound
        self._lru: Any = None  # made on first use: importing mlx-lm imports mlx
        self._disk: Any = None  # kit.engine.cache.disk_tier.DiskTier, see attach_disk
        self.hits = {"memory_hits": 0, "disk_hits": 0, "misses": 0}

    def fetch(self, key: str, prompt: list[int],
              new_cache: Callable[[], Any]) -> tuple[Any, list[int]]:
        """The KV cache to generate ``prompt`` with (a copy; ``new_cache()`` when nothing
        under ``key`` shares a prefix) and the tokens still to prefill (never empty)."""
        cache, rest = self._store().fetch_nearest_cache(key, prompt)
        source = "memory_hits" if cache is not None else "misses"
        if self._disk is not None and (got := self._disk.lookup(
                key, prompt, cache, rest, new_cache, self._store())) is not None:
            (cache, rest), source = got, "disk_hits"
        self.hits[source] += 1
        if cache is None:
            return new_cache(), prompt
        if not rest:  # exact hit: re-feed the last prompt token to get fresh logits
            mlx_lm_api.trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        return cache, rest

    def insert(self, key: str, tokens: list[int], cache: Any) -> None:
        """Keep ``cache``, which holds ``tokens``, for later prompts under ``key`` (and
        queue it for the disk tier)."""
        self._store().insert_cache(key, tokens, cache)
        if self._disk is not None:
            self._disk.queue(tokens, cache)

    def _store(self) -> Any:
        """mlx-lm's ``LRUPromptCache``, made on first use."""
        if self._lru is None:
            bound = self.max_bytes if self.max_bytes is not None else self.default_bytes()
            self._lru = mlx_lm_api.LRUPromptCache(max_size=self.size,
                                       **({} if bound is None else {"max_bytes": bound}))
        return self._lru

    # -- the byte bound (memory admission evicts through these) -------------------------------

    def byte_bound(self) -> int | None:
        """The bound of the store now in use (None: none made yet, or no byte bound)."""
        if self._lru is None or self._lru.max_bytes >= 1 << 62:
            return None
        return self._lru.max_bytes

    def nbytes(self) -> int:
        """Bytes the in-memory caches hold now (mlx-lm's count of their buffers)."""
        return self._lru.nbytes if self._lru is not None else 0

    def entries(self) -> int:
        """How many caches are kept in memory now."""
        return len(self._lru) if self._lru is not None else 0

    def evict(self, n_bytes: int) -> None:
        """Drop least recently used caches until the rest hold at most ``n_bytes``."""
        if self._lru is not None and self._lru.nbytes > n_bytes:
            self._lru.trim_to(n_bytes=n_bytes)

    def next_turn(self, tokens: list[int], resend: list[int], n_prompt: int, cache: Any,
                  prefill: Callable[[Any, list[int]], None]) -> list[int]:
        """Make ``cache`` (holding ``tokens``) hold ``resend``, what the client's next turn
        starts with, and return the tokens it then holds.

        The next request resends this turn as an assistant message rendered by the chat
        template, which is often not the generated text: thinking templates drop the
        reasoning of earlier turns, tool calls are re-serialized, the end-of-turn marker
        differs from the EOS token the model stopped on. The KV of the generated tokens
        after the first difference is useless to the next turn; so the cache is trimmed
        to the common prefix and ``prefill(cache, rest)`` runs the rest of the rendered
        message now (a few tokens, after the client has its answer). Non-trimmable
        caches (recurrent / rotated-out layers) keep ``tokens``, as does a cache for
        which :func:`reusable_prefix` finds nothing to gain.
        """
        common = reusable_prefix(resend, tokens, n_prompt)
        if common is None or not mlx_lm_api.can_trim_prompt_cache(cache):
            return tokens
        mlx_lm_api.trim_prompt_cache(cache, len(tokens) - common)
        prefill(cache, resend[common:])
        return resend

    def clear(self) -> None:
        """Drop every cache in memory (the model they belong to is going away); the disk
        tier and the writes queued for it stay (each knows its model's identity)."""
        self._lru = None

    # -- the disk tier (kit/engine/cache/disk_tier.py) ------------------------------------------

    def attach_disk(self, tier: Any) -> None:
        """Back this cache with ``tier`` (a :class:`kit.engine.cache.disk_tier.DiskTier`)."""
        self._disk = tier

    def model_installed(self) -> None:
        """A model was just loaded: the disk tier takes its identity now."""
        if self._disk is not None:
            self._disk.model_installed()

    def pending(self) -> bool:
        """Whether caches wait to be written to disk."""
        return self._disk is not None and self._disk.pending()

    def write_pending(self) -> None:
        """Write the newest cache queued for the disk (the worker calls it once idle for
        :data:`kit.engine.decode.engine.IDLE_WRITE_S`)."""
        self._disk.write_one()

    def flush(self, seconds: float) -> None:
        """Write what is queued for the disk for at most about ``seconds`` (a stop)."""
        if self._disk is not None:
            self._disk.flush(seconds)

    def stats(self) -> dict[str, int]:
        """Counters for ``/health``: memory_hits, disk_hits, misses (prompts since start),
        memory_bytes / memory_entries (the in-memory LRU), and the disk tier's
        disk_bytes / disk_entries (its files) and disk_writes (since start), 0 without one."""
        lru = self._lru
        disk = self._disk.stats() if self._disk is not None else {
            "disk_bytes": 0, "disk_entries": 0, "disk_writes": 0}
        return {**self.hits, "memory_bytes": lru.nbytes if lru is not None else 0,
                "memory_entries": len(lru) if lru is not None else 0, **disk}


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

    def prepare(self, job: Job, running: bool = False) -> Run:
        """Everything before the first token: sampling checks, chat template, context
        check, constraint, sampler, prompt-cache lookup; posts ``Started``.

        Args:
            running: other requests decode now (a batch with active rows): only then may
                admission defer this one (see :meth:`Admission.admit`).

        Raises:
            Deferred: only with ``running``: it fits once a running request completes.
            InvalidRequest: bad sampling parameters, the template rejects the messages,
                the context is exceeded, or the constraint does not compile.
        """
        req, params = job.request, job.request.params
        t0 = time.perf_counter()
        self.sampling.check(params)
        prompt = self.prompts.tokens(req, params.max_tokens, on_large=self._reclaim_later)
        grammar, forced, source = self.prompts.constraint(req, prompt)
        prompt += forced
        n_max = max_tokens(self.slot.info, len(prompt), params.max_tokens)
        sampler, processors = self.sampling.build(params, grammar, source)
        key = self.slot.info.id
        # a new cache is quantized from its first token with --kv-bits (kit.engine.cache.kv), so
        # cached ones are too: a prefix hit continues in the same precision as a cold run
        cache, rest = self.cache.fetch(key, prompt, self.slot.new_cache)
        cached = len(prompt) - len(rest)
        tok = self.slot.tokenizer
        parser = OutputParser(stops=params.stop) if req.raw else OutputParser.for_format(
            self.slot.output_format, self.prompts.tail_text(prompt), stops=params.stop,
            tools=req.tools, in_tool_call=req.force_tool is not None and bool(forced),
            tokenizer=tok)
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
        job.post(Started(key, len(prompt), cached, n_max, asked))
        return Run(job, key, prompt, rest, cache, cached, n_max, sampler, processors, parser,
                   t0, logprob=self.sampling.logprob if params.logprobs else None)

    def complete(self, run: Run, finish_reason: str, tokens: list[int], cache: Any) -> None:
        """After the last token: flush the parser, post ``Finished``, then store the prompt
        cache (``tokens``: what ``cache`` holds; ``cache`` None: nothing worth keeping),
        fitted to what the next turn will resend (:meth:`PromptCachePolicy.next_turn`).
        The caller posts END."""
        self.admission.release(run.job)
        run.emit(run.parser.finish(finish_reason))
        if finish_reason == "stop" and run.parser.tool_calls:
            finish_reason = "tool_calls"
        usage = Usage(len(run.prompt), run.n, run.cached,
                      min(run.parser.reasoning_tokens, run.n))
        tps = (run.n - 1) / (time.perf_counter() - run.first_at) if run.n > 1 else 0.0
        log.info("%s: %s, prompt %d tokens (%d cached), generated %d, ttft %.3f s, "
                 "%.1f tok/s, %s", run.job.request.request_id, run.key, usage.prompt_tokens,
                 run.cached, run.n, run.ttft, tps, finish_reason)
        text = "".join(run.texts)
        log.debug("%s: text %r", run.job.request.request_id, text)
        self._served()  # before the client can see the end (and ask /health)
        run.job.post(Finished(finish_reason, usage, run.key, run.ttft, tps,
                              run.parser.stop_string))
        if cache is None:
            return
        if finish_reason != "cancelled" and not run.job.request.raw:
            tokens = self._next_turn(run, tokens, cache, text)
        self.cache.insert(run.key, tokens, cache)

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

    def _next_turn(self, run: Run, tokens: list[int], cache: Any, text: str) -> list[int]:
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

        kept = self.cache.next_turn(tokens, resend, len(run.prompt), cache, prefill)
        if refilled:
            log.debug("%s: cached the next turn's prefix: %d tokens (%d re-rendered)",
                      req.request_id, len(resend), refilled[0])
        return kept

    def _prefill(self, cache: Any, tokens: list[int]) -> None:
        """Run the model over ``tokens`` into ``cache`` (chunked, on mlx-lm's stream)."""
        import mlx.core as mx
        step = prefill_step_size()
        with mx.stream(mlx_lm_api.generation_stream):  # the stream mlx-lm generates on (GPU: no hops)
            for i in range(0, len(tokens), step):
                self.slot.model(mx.array(tokens[i:i + step])[None], cache=cache)
                mx.eval([c.state for c in cache])


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
