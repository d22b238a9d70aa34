"""The engine's protocol-neutral request and event types.

Every protocol module (OpenAI chat/completions/Responses, Anthropic Messages, Gemini)
translates its request into a :class:`ChatRequest` and renders the engine's events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

# The engine's errors are part of its interface; they live in the one error tree.
from kit.errors import (  # noqa: F401
    EngineError,
    EngineUnavailable,
    InvalidRequest,
    ModelLoadError,
    ModelUnavailable,
)

# The delta events come from the output parsers (formats); they are the engine's events too.
from kit.formats.events import ReasoningDelta, TextDelta, TokenLogprob, ToolCall  # noqa: F401


@dataclass(frozen=True)
class SamplingParams:
    """How to sample (mlx-lm's ``make_sampler`` / ``make_logits_processors``).

    Attributes:
        max_tokens: most tokens to generate (>= 1), or None for "as many as the model's
            output cap and the context window allow".
        temperature: 0 means greedy.
        top_p: nucleus mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 disables it.
        min_p: drop tokens below min_p x the top token's probability; 0 disables it.
        presence_penalty, frequency_penalty: OpenAI-style additive penalties, or None.
        logit_bias: token id -> bias added to its logit.
        stop: strings that end generation; the matched string is not returned.
        seed: seed for mlx's random generator, or None.
        logprobs: return the log probability of each generated token.
        top_logprobs: also return this many most likely alternatives per token (0-20).
    """

    max_tokens: int | None = None
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0


@dataclass(frozen=True)
class ImageInput:
    """One image a request carries, checked by the HTTP side before it reaches the engine
    (:mod:`kit.server.content.media`: bytes, pixel count and format bounded; decoded once).

    Attributes:
        data: the image file's bytes as the client sent them (PNG, JPEG, WebP or GIF).
        media_type: ``image/png``, ``image/jpeg``, ``image/webp`` or ``image/gif``.
        width, height: its size in pixels (read from the file's header and checked).
        digest: SHA-256 of ``data``, hex (the vision prompt cache keys turns by it).
    """

    data: bytes
    media_type: str
    width: int
    height: int
    digest: str


@dataclass(frozen=True)
class AudioInput:
    """One audio clip a request carries, checked by the HTTP side before it reaches the
    engine (:mod:`kit.server.content.audio`: a PCM WAV file, bytes and duration bounded).

    Attributes:
        data: the WAV file's bytes as the client sent them.
        seconds: its duration (frames / frame rate, from its header, checked whole).
        sample_rate: frames per second (the model's processor resamples to its own).
        digest: SHA-256 of ``data``, hex (the prompt cache keys turns by it).
    """

    data: bytes
    seconds: float
    sample_rate: int
    digest: str


@dataclass
class ChatRequest:
    """One chat generation.

    Attributes:
        messages: chat messages ``{"role": "system"|"user"|"assistant"|"tool", "content": str,
            ...}`` with content already flattened to a string (tool_calls and tool_call_id
            kept as given), ready for the model's chat template. A message that carries
            images has a list instead, in the multimodal form chat templates read:
            ``[{"type": "text", "text": str}, {"type": "image"}, ...]`` in the order the
            client sent them.
        images: the images of the ``{"type": "image"}`` parts, in message order (the
            i-th such part across ``messages`` is ``images[i]``); empty for text.
        audio: the clips of the ``{"type": "audio"}`` parts, the same way (a model whose
            processor takes audio; :mod:`kit.engine.decode.vision`).
        params: sampling parameters.
        prompt: raw prompt text, used as is instead of ``messages`` and the chat template
            (legacy completions); no reasoning or tool-call parsing then.
        prompt_ids: the raw prompt as token ids instead (legacy completions accept them);
            the engine checks them against the vocabulary.
        tools: OpenAI-style function tool schemas handed to the chat template, or None.
        model: the real model id the request must run on, or None for whatever is
            behind ``local`` when its turn comes.
        adapter: the LoRA adapter (``serve --adapter NAME=PATH``) it runs with, or None
            for the base model (:mod:`kit.engine.decode.adapters`).
        template_kwargs: extra variables for the chat template (``enable_thinking``,
            ``reasoning_effort``...).
        force_tool: None lets the model decide whether to call a tool; ``""`` forces a
            call to one of ``tools``, a name forces a call to that tool (``tool_choice``
            required / named; see :mod:`kit.engine.decode.grammar`).
        parallel_tool_calls: the model may call several tools in one turn (OpenAI's
            ``parallel_tool_calls``, not Anthropic's ``disable_parallel_tool_use``): a
            forced turn's grammar allows one or more calls in the family's markup; False
            allows one, and an unforced turn ends after its first call
            (:meth:`kit.formats.output.OutputParser.for_format`).
        response_schema: a JSON schema the answer text must follow (``response_format``;
            ``{"type": "object"}`` for json_object), or None for free text.
        request_id: an id for logs.
    """

    messages: list[dict[str, Any]]
    params: SamplingParams = field(default_factory=SamplingParams)
    images: tuple[ImageInput, ...] = ()
    audio: tuple[AudioInput, ...] = ()
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    model: str | None = None
    adapter: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    force_tool: str | None = None
    parallel_tool_calls: bool = True
    response_schema: dict[str, Any] | None = None
    request_id: str = ""

    @property
    def raw(self) -> bool:
        """The prompt is used as is (text or token ids): no chat template, no parsing."""
        return self.prompt is not None or self.prompt_ids is not None


@dataclass(frozen=True)
class Usage:
    """Token counts of one request: prompt tokens (of which ``cached_tokens`` came from the
    prompt cache, and ``image_tokens`` and ``audio_tokens`` stand for the request's images
    and video, and audio clips: a vision model's placeholder tokens, which its towers'
    features replace) and generated tokens (of which ``reasoning_tokens`` were generated
    inside the model's think block, its markers included)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Started:
    """The first event of every generation: the request passed validation and runs on
    ``model`` (the real id, which a swap may have changed since the request was queued).
    ``max_tokens``: the most tokens it may generate (None: not given); ``clamped_from``:
    the max_tokens asked for when memory admission capped it (:mod:`kit.engine.cache.admission`),
    else None."""

    model: str
    prompt_tokens: int
    cached_tokens: int
    max_tokens: int | None = None
    clamped_from: int | None = None


@dataclass(frozen=True)
class Finished:
    """The last event of a successful generation.

    Attributes:
        finish_reason: ``"stop"`` (EOS or a stop string), ``"tool_calls"`` (the model
            called tools), ``"length"`` (max_tokens hit) or ``"cancelled"`` (the client
            went away).
        usage: token counts.
        model: the real model id that generated the text.
        ttft_s: seconds from the start of this request's work to its first token.
        decode_tps: decode speed in tokens per second.
        stop_string: the stop string that ended generation, if one did.
    """

    finish_reason: str
    usage: Usage
    model: str = ""
    ttft_s: float = 0.0
    decode_tps: float = 0.0
    stop_string: str | None = None


Event = Union[Started, TextDelta, ReasoningDelta, ToolCall, Finished]
