"""Sampling: the checks on sampling parameters, mlx-lm's sampler and logits processors
(penalties, logit bias, a grammar's token mask), the completion budget within the context
window, prefill chunking and per-token logprobs."""

from __future__ import annotations

import math
from typing import Any

from kit import mlx_lm_api
from kit.engine.decode.grammar import GrammarProcessor
from kit.engine.decode.slot import ModelSlot
from kit.engine.types import InvalidRequest, SamplingParams, TokenLogprob
from kit.models.resolve import ModelInfo

#: tokens mlx-lm's presence/frequency penalties look back (its default)
PENALTY_CONTEXT = 20


def max_tokens(info: ModelInfo, n_prompt: int, requested: int | None,
               at_least: bool = False) -> int:
    """Tokens to generate for a prompt of ``n_prompt`` tokens within ``info``'s context
    window: ``requested``, or (None) as many as the window and the model's output cap
    allow. ``at_least``: ``n_prompt`` is a lower bound, not the count (the prompt was not
    tokenized).

    Raises:
        InvalidRequest: ``context_length_exceeded`` (OpenAI's wording, which agents such as
            pi recognise and answer by compacting); it never quotes the prompt.
    """
    window = info.context_window
    more = "at least " if at_least else ""
    if requested is not None and n_prompt + requested > window:
        raise InvalidRequest(
            f"This model's maximum context length is {window} tokens. However, you "
            f"requested {more}{n_prompt + requested} tokens ({more}{n_prompt} in the "
            f"messages, {requested} in the completion). Please reduce the length of the "
            "messages or completion.", code="context_length_exceeded")
    if requested is None and n_prompt >= window:
        raise InvalidRequest(
            f"This model's maximum context length is {window} tokens. However, your "
            f"messages resulted in {more}{n_prompt} tokens. Please reduce the length of "
            "the messages.", code="context_length_exceeded")
    return requested if requested is not None else min(info.max_output_tokens,
                                                       window - n_prompt)


#: distinct sampler settings kept (:meth:`Sampling.sampler`)
MAX_SAMPLERS = 64


class Sampling:
    """Samplers for the model in ``slot`` (its vocabulary, its grammar tokenizer)."""

    def __init__(self, slot: ModelSlot) -> None:
        self.slot = slot
        # (temperature, top_p, min_p, top_k) -> mlx-lm's sampler. One object per setting:
        # BatchGenerator samples a batch in one call only when its rows share the sampler
        # object (else one slice, sampler and concatenate per row and step). mlx-lm's
        # samplers are pure functions of their settings (the random state is mlx's), so
        # requests can share them.
        self._samplers: dict[tuple, Any] = {}

    def check(self, params: SamplingParams) -> None:
        """Reject what would crash or break mlx-lm's samplers for everyone: token ids
        outside the vocabulary in ``logit_bias`` (mlx indexes out of bounds), non-finite
        biases, ``top_k`` not below the vocabulary size (its error left the sampler broken
        for later requests).

        Raises:
            InvalidRequest: with the parameter at fault as ``field``.
        """
        vocab = self.slot.vocab_size()
        for token, bias in params.logit_bias:
            if not 0 <= token < vocab:
                raise InvalidRequest(f"logit_bias: token id {token} is not in this model's "
                                     f"vocabulary (0..{vocab - 1})", field="logit_bias")
            if not math.isfinite(bias):
                raise InvalidRequest("logit_bias values must be finite numbers",
                                     field="logit_bias")
        if params.top_k and params.top_k >= vocab:
            raise InvalidRequest(f"top_k must be below this model's vocabulary size ({vocab})",
                                 field="top_k")

    def build(self, params: SamplingParams, grammar: str | None,
              source: str) -> tuple[Any, list[Any]]:
        """Seed mlx's generator (``params.seed``) and make the sampler and the logits
        processors (penalties, logit bias, then ``grammar``'s mask, if any; ``source`` is
        the request field the grammar comes from, for errors).

        Raises:
            InvalidRequest: the grammar does not compile.
        """
        import mlx.core as mx
        if params.seed is not None:
            mx.random.seed(params.seed)
        sampler = self.sampler(params)
        processors = mlx_lm_api.make_logits_processors(
            logit_bias=dict(params.logit_bias) or None,
            presence_penalty=params.presence_penalty or None,
            frequency_penalty=params.frequency_penalty or None)
        if grammar is not None:
            processors.append(self.grammar_processor(grammar, source))
        return sampler, processors

    def sampler(self, params: SamplingParams) -> Any:
        """mlx-lm's sampler for ``params``' temperature, top_p, min_p and top_k: the same
        object for the same four values (at most :data:`MAX_SAMPLERS` kept)."""
        key = (params.temperature, params.top_p, params.min_p, params.top_k)
        sampler = self._samplers.get(key)
        if sampler is None:
            if len(self._samplers) >= MAX_SAMPLERS:  # bounded: clients choose the values
                self._samplers.clear()
            sampler = self._samplers[key] = mlx_lm_api.make_sampler(
                temp=params.temperature, top_p=params.top_p, min_p=params.min_p,
                top_k=params.top_k)
        return sampler

    def grammar_processor(self, grammar: str, param: str) -> Any:
        """A logits processor for ``grammar`` (a llguidance grammar string).

        Raises:
            InvalidRequest: the grammar does not compile (e.g. an unsupported schema);
                ``field`` is ``param``.
        """
        ll = self.slot.grammar_tokenizer()
        try:
            return GrammarProcessor(ll, grammar)
        except ValueError as e:
            reason = str(e).splitlines()[0][:300] if str(e) else "invalid schema"
            raise InvalidRequest(f"cannot constrain the output to this schema: {reason}",
                                 field=param) from None

    def logprob(self, token: int, lp: Any, top_n: int) -> TokenLogprob:
        """``token``'s log probability from ``lp`` (mlx array over the vocabulary) and the
        ``top_n`` most likely alternatives, as text."""
        import mlx.core as mx

        decode = self.slot.tokenizer.decode
        top: tuple[tuple[str, float], ...] = ()
        if top_n:
            ids = mx.argpartition(-lp, kth=top_n - 1)[:top_n]
            vals = lp[ids]
            order = mx.argsort(-vals)
            top = tuple((decode([int(i)]), float(v))
                        for i, v in zip(ids[order].tolist(), vals[order].tolist()))
        return TokenLogprob(decode([token]), float(lp[token].item()), top)
