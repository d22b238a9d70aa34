"""The request pipeline both decode paths share: :meth:`Pipeline.prepare` (everything
before the first token) and :meth:`Pipeline.complete` (everything after the last),
with the prompt cache behind :class:`PromptCachePolicy`.

Sequential decode (:mod:`kit.engine.sequential`) and batching (:mod:`kit.engine.batch`)
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

from kit.engine.bridge import END
from kit.engine.prompt import Prompts
from kit.engine.run import Job, Run
from kit.engine.sampling import Sampling, max_tokens, prefill_step_size
from kit.engine.slot import ModelSlot
from kit.engine.types import Finished, Started, Usage

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

    Args:
        size: how many caches to keep.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lru: Any = None  # made on first use: importing mlx-lm imports mlx

    def fetch(self, key: str, prompt: list[int],
              new_cache: Callable[[], Any]) -> tuple[Any, list[int]]:
        """The KV cache to generate ``prompt`` with (a copy; ``new_cache()`` when nothing
        under ``key`` shares a prefix) and the tokens still to prefill (never empty)."""
        from mlx_lm.models.cache import trim_prompt_cache

        cache, rest = self._store().fetch_nearest_cache(key, prompt)
        if cache is None:
            return new_cache(), prompt
        if not rest:  # exact hit: re-feed the last prompt token to get fresh logits
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        return cache, rest

    def insert(self, key: str, tokens: list[int], cache: Any) -> None:
        """Keep ``cache``, which holds ``tokens``, for later prompts under ``key``."""
        self._store().insert_cache(key, tokens, cache)

    def _store(self) -> Any:
        """mlx-lm's ``LRUPromptCache``, made on first use."""
        if self._lru is None:
            from mlx_lm.models.cache import LRUPromptCache

            self._lru = LRUPromptCache(max_size=self.size)
        return self._lru

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
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        common = reusable_prefix(resend, tokens, n_prompt)
        if common is None or not can_trim_prompt_cache(cache):
            return tokens
        trim_prompt_cache(cache, len(tokens) - common)
        prefill(cache, resend[common:])
        return resend

    def clear(self) -> None:
        """Drop every cache (the model they belong to is going away)."""
        self._lru = None


class Pipeline:
    """Prepare and complete requests for the model in ``slot``.

    Args:
        slot: the model.
        cache: the prompt-cache policy.
        servable: the engine's ``job -> bool``: get the model ready for the job (reload it
            after an idle unload) or post the error and END and return False.
        served: called once a request is counted as served, before its ``Finished``.
    """

    def __init__(self, slot: ModelSlot, cache: PromptCachePolicy,
                 servable: Callable[[Job], bool], served: Callable[[], None]) -> None:
        self.slot = slot
        self.prompts = Prompts(slot)
        self.sampling = Sampling(slot)
        self.cache = cache
        self.reclaim = False  # a large prompt was prepared: give memory back when idle
        self.sync: Callable[[], None] = lambda: None  # the engine's Inbox.sync
        self.fatal: Callable[[BaseException], None] = lambda error: None  # Engine's on_fatal
        self._servable, self._served = servable, served

    def admit(self, job: Job) -> bool:
        """Whether ``job`` should run now: not cancelled (else it is ended) and servable
        (see ``servable``)."""
        if job.cancelled.is_set():
            job.post(END)
            return False
        return self._servable(job)

    def _reclaim_later(self) -> None:
        self.reclaim = True  # given back once the worker is idle

    def prepare(self, job: Job) -> Run:
        """Everything before the first token: sampling checks, chat template, context
        check, constraint, sampler, prompt-cache lookup; posts ``Started``.

        Raises:
            InvalidRequest: bad sampling parameters, the template rejects the messages,
                the context is exceeded, or the constraint does not compile.
        """
        from kit.engine.output import OutputParser

        req, params = job.request, job.request.params
        t0 = time.perf_counter()
        self.sampling.check(params)
        prompt = self.prompts.tokens(req, params.max_tokens, on_large=self._reclaim_later)
        grammar, forced, source = self.prompts.constraint(req, prompt)
        prompt += forced
        n_max = max_tokens(self.slot.info, len(prompt), params.max_tokens)
        sampler, processors = self.sampling.build(params, grammar, source)
        key = self.slot.info.id
        # a new cache is quantized from its first token with --kv-bits (kit.engine.kv), so
        # cached ones are too: a prefix hit continues in the same precision as a cold run
        cache, rest = self.cache.fetch(key, prompt, self.slot.new_cache)
        cached = len(prompt) - len(rest)
        job.post(Started(key, len(prompt), cached))
        tok = self.slot.tokenizer
        parser = OutputParser(stops=params.stop) if req.raw else OutputParser.for_format(
            self.slot.output_format, self.prompts.tail_text(prompt), stops=params.stop,
            tools=req.tools, in_tool_call=req.force_tool is not None and bool(forced),
            tokenizer=tok)
        return Run(job, key, prompt, rest, cache, cached, n_max, sampler, processors, parser,
                   t0, logprob=self.sampling.logprob if params.logprobs else None)

    def complete(self, run: Run, finish_reason: str, tokens: list[int], cache: Any) -> None:
        """After the last token: flush the parser, post ``Finished``, then store the prompt
        cache (``tokens``: what ``cache`` holds; ``cache`` None: nothing worth keeping),
        fitted to what the next turn will resend (:meth:`PromptCachePolicy.next_turn`).
        The caller posts END."""
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
        from mlx_lm.generate import generation_stream

        step = prefill_step_size()
        with mx.stream(generation_stream):  # the stream mlx-lm generates on (GPU: no hops)
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
