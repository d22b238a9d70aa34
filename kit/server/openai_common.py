"""What the OpenAI routers (chat completions, legacy completions, Responses) share: the
sampling fields and their translation, ``response_format``/``text.format`` schemas, usage,
OpenAI's field names for the engine's errors, and the chunk stream's tail (Finished ->
usage chunk -> ``[DONE]``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

from kit.engine.types import Finished, SamplingParams
from kit.server import sse
from kit.server.adapter import Renderer
from kit.server.content import (
    Id,
    LenientModel,
    MAX_STOPS,
    MAX_TOKENS,
    Text,
    TokenCount,
    either,
    number,
)
from kit.server.errors import APIError
from kit.server.translate import stop_strings


class StreamOptions(LenientModel):
    include_usage: bool = False


MAX_LOGIT_BIAS = 1024  # logit_bias entries
TokenKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]


class SamplingFields(LenientModel):
    """Request fields both OpenAI text endpoints accept, in the ranges OpenAI's API
    documents (top_k and min_p are extensions)."""

    model: Id
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: TokenCount | None = None
    temperature: float | None = number(0, 2)
    top_p: float | None = number(0, 1, above=True)
    stop: either(Text, list[Text]) | None = Field(default=None)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    n: int | None = Field(default=None, ge=1, le=128)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    min_p: float | None = number(0, 1)
    presence_penalty: float | None = number(-2, 2)
    frequency_penalty: float | None = number(-2, 2)
    logit_bias: dict[TokenKey, Bias] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    user: Id | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: Any) -> Any:
        if isinstance(stop, list) and len(stop) > MAX_STOPS:
            raise PydanticCustomError("too_many", "at most {n} stop strings", {"n": MAX_STOPS})
        return stop


def sampling(body: SamplingFields, defaults: SamplingParams, *, max_tokens: int | None,
             logprobs: bool, top_logprobs: int) -> SamplingParams:
    """The engine's sampling parameters for ``body``; ``defaults`` fills temperature,
    top_p, top_k and min_p (an omitted max_tokens stays None: the engine fits it to the
    context window).

    Raises:
        APIError: 400 for n > 1 or logit_bias keys that are not token ids.
    """
    if body.n is not None and body.n > 1:
        raise APIError(400, "n > 1 is not supported", param="n", code="unsupported_value")
    try:
        bias = tuple((int(k), float(v)) for k, v in (body.logit_bias or {}).items())
    except ValueError:
        raise APIError(400, "logit_bias keys must be token ids", param="logit_bias",
                       code="invalid_value") from None
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=defaults.temperature if body.temperature is None else body.temperature,
        top_p=defaults.top_p if body.top_p is None else body.top_p,
        top_k=defaults.top_k if body.top_k is None else body.top_k,
        min_p=defaults.min_p if body.min_p is None else body.min_p,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=bias,
        stop=stop_strings(stop),
        seed=body.seed,
        logprobs=logprobs,
        top_logprobs=top_logprobs if logprobs else 0,
    )


def response_schema(fmt: Any, param: str) -> dict[str, Any] | None:
    """The JSON schema an answer must follow (``ChatRequest.response_schema``) from a
    validated ``response_format`` (Chat Completions: ``{"type": "json_schema",
    "json_schema": {"schema": ...}}``) or ``text.format`` (Responses: ``{"type":
    "json_schema", "schema": ...}``); ``{"type": "object"}`` for json_object; None for text
    or no format.

    Raises:
        APIError: 400 for a json_schema without a schema object.
    """
    kind = getattr(fmt, "type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = getattr(fmt, "json_schema", fmt)  # chat nests the spec; Responses does not
    if spec.schema_ is None:
        raise APIError(400, f"{param} json_schema needs a 'schema' object",
                       param=f"{param}.json_schema.schema" if spec is not fmt
                       else f"{param}.schema", code="invalid_value")
    return spec.schema_


def usage(fin: Finished | None) -> dict[str, Any] | None:
    """OpenAI's usage object (with ``prompt_tokens_details.cached_tokens`` and
    ``audio_tokens``, and ``completion_tokens_details.reasoning_tokens``)."""
    if fin is None:
        return None
    u = fin.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens,
                                      "audio_tokens": u.audio_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}


#: OpenAI's names for the engine's neutral field names (the other fields are the same).
OPENAI_FIELDS = {"schema": "response_format", "template_kwargs": "chat_template_kwargs"}


class ChunkStream(Renderer):
    """The stream both OpenAI chunk APIs end the same way: the last choice chunk with the
    finish reason, a usage chunk with empty ``choices`` when ``stream_options.include_usage``
    asked for one, then ``data: [DONE]`` (also after an error, which is a chunk holding
    OpenAI's error object). Subclasses make the chunks (:meth:`last_chunk`)."""

    def __init__(self, base: dict[str, Any], include_usage: bool) -> None:
        self.base, self.include_usage = base, include_usage

    def last_chunk(self, fin: Finished) -> dict:
        raise NotImplementedError

    def finish(self, fin: Finished) -> list:
        tail = [sse.data({**self.base, "choices": [], "usage": usage(fin)})] \
            if self.include_usage else []
        return [self.last_chunk(fin), *tail]

    def error(self, e: APIError) -> list:
        return [sse.data(e.body())]

    def closing(self) -> list:
        return [sse.DONE]


def finish_reason(fin: Finished | None) -> str:
    """OpenAI's ``finish_reason`` (``stop`` when the engine ended without one)."""
    return fin.finish_reason if fin else "stop"
