"""Speculative decoding: a small draft model proposes tokens that the served model checks
in one forward pass (mlx-lm's ``speculative_generate_step``, driven by
:func:`speculative_stream`).

Which model gets a draft: ``serve --draft-model DRAFT`` pairs DRAFT with the model the
server starts with; ``--draft-model TARGET=DRAFT`` (repeatable; also ``MLX_KIT_DRAFT_MODEL``,
comma-separated: set once) pairs it with TARGET whenever TARGET is loaded, a swap
included. A draft is loaded beside its target and released with it; its weights and KV
cache count in the target's fit check and memory admission (:meth:`Drafts.estimate`).

When it is used: a request decoding **alone** (:mod:`kit.engine.decode.sequential`) with
no grammar (forced tool calls and JSON schemas keep llguidance's matcher, which cannot
take back the tokens a draft proposed and the target refused). A batch never drafts:
mlx-lm's ``BatchGenerator`` has no draft model. A lone request that a new arrival moves
into a batch keeps its progress and continues without the draft. Under greedy sampling
the text is the target's own, token for token (the target checks every proposed token);
under sampling, mlx-lm accepts a draft token only when the target samples the same one.

The prompt cache of a drafted request holds both models' KV (the target's layers, then
the draft's, as ``speculative_generate_step`` splits them), filed under its own key
(:data:`DRAFT_SEPARATOR`), memory tier only, so a later drafted turn reuses both.

Counters (``/health`` ``draft``, ``/metrics``): tokens drafted (proposals the target
checked) and accepted; acceptance = accepted / drafted.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import mlx_lm_api
from kit.errors import ConfigError, ModelError
from kit.models.memory import Estimate, estimate
from kit.models.resolve import ModelInfo, resolve_model

log = logging.getLogger("mlx_kit.engine")

#: Between a model id and its draft's in a prompt-cache key: a NUL byte is in no model id
#: (no path or hub id holds one), so a drafted key never equals another model's.
DRAFT_SEPARATOR = "\x00draft="


def parse_pairings(specs: tuple[str, ...] | list[str], started: str) -> dict[str, str]:
    """``--draft-model`` values -> ``{target id: draft spec}``: ``DRAFT`` pairs with
    ``started`` (the model the server starts with), ``TARGET=DRAFT`` with TARGET (a folder
    as its resolved path, the id it loads under).

    Raises:
        ConfigError: an empty target or draft, or one target paired with two drafts
            (naming the flag).
    """
    out: dict[str, str] = {}
    for spec in specs:
        target, sep, draft = spec.partition("=")
        if not sep:
            target, draft = started, spec
        target, draft = target.strip(), draft.strip()
        if not target or not draft:
            raise ConfigError(f"--draft-model {spec!r}: expected DRAFT or TARGET=DRAFT",
                              hint="e.g. --draft-model mlx-community/Qwen3-0.6B-4bit")
        folder = Path(target).expanduser()
        if folder.is_dir():  # a folder's model id is its resolved path (kit.models.resolve)
            target = str(folder.resolve())
        if out.get(target, draft) != draft:
            raise ConfigError(f"--draft-model pairs {target} with both {out[target]} and "
                              f"{draft}", hint="give each model one draft")
        out[target] = draft
    return out


def vocab_of(folder: Path) -> dict[str, int] | None:
    """The token -> id map of the ``tokenizer.json`` in ``folder`` (added tokens included),
    or None when it has none (read with the ``tokenizers`` library: fast, no mlx)."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)


def check_same_tokenizer(target: ModelInfo, draft: ModelInfo,
                         target_vocab: dict[str, int] | None = None,
                         draft_vocab: dict[str, int] | None = None) -> None:
    """Refuse a draft whose vocabulary differs from its target's: the target checks the
    draft's token ids as its own, so any difference makes the proposals wrong tokens.

    ``target_vocab``/``draft_vocab``: the maps when already loaded (default: read from
    each folder's tokenizer.json; a folder without one is not compared here).

    Raises:
        ConfigError: the vocabularies differ, naming both models and how.
    """
    a = target_vocab if target_vocab is not None else vocab_of(target.path)
    b = draft_vocab if draft_vocab is not None else vocab_of(draft.path)
    if a is None or b is None or a == b:
        return
    differ = sorted((t for t in a.keys() | b.keys() if a.get(t) != b.get(t)),
                    key=lambda t: (min(a.get(t, 1 << 62), b.get(t, 1 << 62)), t))
    first = differ[0]
    example = f"e.g. {first!r} is {a.get(first, 'absent')} in the target and " \
              f"{b.get(first, 'absent')} in the draft"
    raise ConfigError(
        f"--draft-model: {draft.id}'s tokenizer differs from {target.id}'s "
        f"({len(b):,} vs {len(a):,} tokens; {len(differ):,} differ, {example})",
        hint="a draft must share its target's tokenizer: pick a smaller model of the same "
             "family (e.g. Qwen3-0.6B for Qwen3-8B)")


@dataclass
class LoadedDraft:
    """A draft model loaded for one target: mlx-lm's model, its id and folder, and its
    layers' count (where its KV starts in a drafted request's cache). Its weights are
    counted in the target's (:meth:`Drafts.estimate`, the load's fit check)."""

    info: ModelInfo
    model: Any
    layers: int


def slow_prefill_warning(draft_id: str, model: Any) -> None:
    """Warn when a quantized draft runs on mlx's CPU backend: its quantized matmuls
    prefill ~20x slower than float32 ones through OpenBLAS (the 4-bit starter: 8 tok/s
    against 180), and every drafted request prefills its prompt through the draft too, so
    a first agent turn's TTFT grows tenfold (docs/performance.md)."""
    import mlx.core as mx

    if mx.default_device().type == mx.DeviceType.cpu and any(
            "QuantizedLinear" in type(m).__name__ for _, m in model.named_modules()):
        log.warning("draft model %s is quantized and mlx runs on the CPU here: it prefills "
                    "every drafted prompt about 20x slower than a float32 model; TTFT will "
                    "grow (a float32 draft, or none, is faster on CPU)", draft_id)


class Drafts:
    """The draft pairings of one engine, the draft loaded now, and its counters.

    Attributes:
        pairings: target id -> draft spec (a hub id or a folder).
        num_draft_tokens: tokens the draft proposes per step (``--num-draft-tokens``).
        loaded: the draft of the installed model, or None.
        drafted, accepted: proposals the target checked, and those it kept (since start).
    """

    def __init__(self, pairings: dict[str, str], num_draft_tokens: int = 3) -> None:
        self.pairings = dict(pairings)
        self.num_draft_tokens = num_draft_tokens
        self.loaded: LoadedDraft | None = None
        self.drafted = 0
        self.accepted = 0
        self._lock = threading.Lock()

    def info_for(self, target: ModelInfo) -> ModelInfo | None:
        """The draft paired with ``target`` (resolved: a hub id in the local cache or a
        folder), or None.

        Raises:
            ModelError: the draft cannot be found (naming it and its target).
        """
        spec = self.pairings.get(target.id)
        if spec is None:
            return None
        try:
            return resolve_model(spec)
        except ModelError as e:
            raise ModelError(f"the draft model of {target.id}: {e.message}",
                             hint=e.hint) from None

    def estimate(self, target: ModelInfo, context: int, kv_bits: int | None,
                 kv_group_size: int) -> tuple[ModelInfo, Estimate] | None:
        """``target``'s draft and what it adds to the fit check (weights + KV for
        ``context`` tokens), or None without a draft or an estimate."""
        info = self.info_for(target)
        if info is None:
            return None
        try:
            return info, estimate(info.path, context, kv_bits=kv_bits,
                                  kv_group_size=kv_group_size)
        except (OSError, ValueError, KeyError) as e:
            log.warning("cannot estimate the memory of the draft %s: %s", info.id, e)
            return None

    def load(self, target: ModelInfo, tokenizer: Any) -> LoadedDraft | None:
        """Load ``target``'s draft (None without one): mlx-lm's model, checked against
        the target's tokenizer (``tokenizer``, mlx-lm's wrapper) and for a trimmable KV
        cache (speculative decoding rewinds it).

        Raises:
            ModelError: it cannot be loaded, its tokenizer differs, or its cache cannot
                be trimmed (each naming the draft and its target).
        """
        info = self.info_for(target)
        if info is None:
            return None
        try:
            model, draft_tok = mlx_lm_api.load(str(info.path))
        except Exception as e:  # noqa: BLE001 (whatever mlx-lm raises for a folder)
            raise ModelError(f"cannot load {info.id}, the draft model of {target.id}: "
                             f"{e}") from None
        try:
            check_same_tokenizer(target, info, mlx_lm_api.hf_tokenizer(tokenizer).get_vocab(),
                                 mlx_lm_api.hf_tokenizer(draft_tok).get_vocab())
        except ConfigError as e:
            raise ModelError(e.message, hint=e.hint) from None
        if not mlx_lm_api.can_trim_prompt_cache(mlx_lm_api.make_prompt_cache(model)):
            raise ModelError(f"{info.id} cannot draft for {target.id}: its KV cache cannot "
                             "be rewound (a recurrent or sliding-window model)",
                             hint="pick a draft with plain attention layers")
        log.info("draft model %s loaded for %s (%d draft tokens per step)", info.id,
                 target.id, self.num_draft_tokens)
        slow_prefill_warning(info.id, model)
        return LoadedDraft(info, model, len(model.layers))

    def usable(self, request: Any) -> LoadedDraft | None:
        """The draft a request decoding alone runs with: the loaded one, unless a grammar
        constrains the request (forced tool calls, a JSON schema: llguidance's matcher
        cannot take back proposals the target refuses); None otherwise."""
        if request.force_tool is not None or request.response_schema is not None:
            return None
        return self.loaded

    def count(self, from_draft: list[bool]) -> None:
        """Add one request's tokens to the counters: ``from_draft`` says, for each token
        generated with the draft, whether it was a proposal the target kept. Every step
        ends on one token of the target's own, so steps = the False ones, and each step
        checked ``num_draft_tokens`` proposals (fewer only at the ``max_tokens`` cap)."""
        steps = sum(1 for f in from_draft if not f)
        accepted = len(from_draft) - steps
        with self._lock:
            self.accepted += accepted
            self.drafted += max(accepted, steps * self.num_draft_tokens)

    def status(self) -> dict[str, Any] | None:
        """``/health``'s ``draft``: the loaded draft's id (None: none loaded now), the
        pairings, ``num_draft_tokens``, ``drafted``, ``accepted`` and ``acceptance`` (None
        before any); None when no draft is configured."""
        if not self.pairings:
            return None
        with self._lock:
            drafted, accepted = self.drafted, self.accepted
        return {"model": self.loaded.info.id if self.loaded else None,
                "pairings": dict(self.pairings), "num_draft_tokens": self.num_draft_tokens,
                "drafted": drafted, "accepted": accepted,
                "acceptance": round(accepted / drafted, 4) if drafted else None}


def target_part(cache: list[Any], draft: LoadedDraft) -> list[Any]:
    """The target model's layers of a drafted request's cache (the draft's come last)."""
    return cache[:len(cache) - draft.layers]


def draft_part(cache: list[Any], draft: LoadedDraft) -> list[Any]:
    """The draft's layers of a drafted request's cache (after the target's)."""
    return cache[len(cache) - draft.layers:]


def aligned(cache: list[Any], draft: LoadedDraft, tokens: list[int]) -> list[int]:
    """Trim a drafted request's finished ``cache`` so that the target's and the draft's
    layers hold the same tokens (mlx-lm leaves the draft a token behind or ahead of the
    target, depending on where the last step ended), and return the tokens it holds now
    (a prefix of ``tokens``, the prompt and the generated tokens), for the prompt cache."""
    import mlx.core as mx

    target, mine = target_part(cache, draft), draft_part(cache, draft)
    mx.eval([c.state for c in cache])
    held = min(target[0].offset, mine[0].offset, len(tokens))
    mlx_lm_api.trim_prompt_cache(target, target[0].offset - held)
    mlx_lm_api.trim_prompt_cache(mine, mine[0].offset - held)
    return tokens[:held]


@dataclass
class Step:
    """One token of :func:`speculative_stream` (the fields of mlx-lm's
    ``GenerationResponse`` that the engine reads)."""

    text: str
    token: int
    logprobs: Any
    from_draft: bool
    finish_reason: str | None = None


def speculative_stream(model: Any, tokenizer: Any, draft: LoadedDraft, prompt: list[int],
                       num_draft_tokens: int, max_tokens: int, **kwargs: Any) -> Any:
    """``mlx_lm.stream_generate(..., draft_model=...)`` with one difference the prompt cache
    needs: closing this generator closes mlx-lm's ``speculative_generate_step`` at once,
    whose ``finally`` rewinds both caches past the proposals the model refused.
    ``stream_generate`` leaves that to the garbage collector, so the rewind could come
    after the engine stored the cache, and trim a stored prefix (the next request sharing
    it decoded from the wrong KV). The same text, tokens and finish reasons as
    ``stream_generate`` (an end token stops with ``"stop"``; the ``max_tokens``-th token
    comes last with ``"length"``).

    ``kwargs``: ``speculative_generate_step``'s (sampler, logits_processors, prompt_cache,
    prefill_step_size).
    """
    import mlx.core as mx

    steps = mlx_lm_api.speculative_generate_step(
        mx.array(prompt), model, draft.model, mlx_lm_api.generation_stream,
        num_draft_tokens=num_draft_tokens, max_tokens=max_tokens, **kwargs)
    detok = tokenizer.detokenizer
    detok.reset()
    token, logprobs, from_draft, reason = None, None, False, "length"
    try:
        with mlx_lm_api.wired_limit(model, [mlx_lm_api.generation_stream]):
            for n, (token, logprobs, from_draft) in enumerate(steps):
                if token in tokenizer.eos_token_ids:
                    reason = "stop"
                    break
                detok.add_token(token)
                if n + 1 == max_tokens:
                    break
                yield Step(detok.last_segment, token, logprobs, from_draft)
            detok.finalize()
            if token is not None:
                yield Step(detok.last_segment, token, logprobs, from_draft, reason)
    finally:
        steps.close()
