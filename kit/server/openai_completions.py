"""POST /v1/completions (OpenAI's legacy text completions), streaming (SSE) and not: the
request model, one translation into the engine's ChatRequest and one renderer."""

from __future__ import annotations

import time
from typing import Annotated, Any, Union

from fastapi import Request
from pydantic import Discriminator, Field, StrictInt, Tag, field_validator

from kit.engine.types import (
    ChatRequest,
    Finished,
    SamplingParams,
    Started,
    TextDelta,
    TokenLogprob,
)
from kit.server import sse
from kit.server.adapter import begin, protocol_router, respond
from kit.server.content import MediaReader, Text, TokenCount
from kit.server.errors import APIError
from kit.server.openai_common import (
    ChunkStream,
    OPENAI_FIELDS,
    SamplingFields,
    finish_reason,
    sampling,
    usage,
)
from kit.server.protocol import Protocol, under

#: Completions' names for the engine's neutral field names: the input is ``prompt`` here
#: (there is no ``messages`` field to name).
COMPLETIONS_FIELDS = {**OPENAI_FIELDS, "messages": "prompt"}

router = protocol_router(COMPLETIONS_FIELDS)


TokenId = Annotated[StrictInt, Field(ge=0)]  # checked against the vocabulary by the engine


def _prompt_kind(value: Any) -> str:
    first = value[0] if isinstance(value, list) and value else None
    if isinstance(value, str):
        return "text"
    return {int: "ids", list: "batch"}.get(type(first), "texts")


Prompt = Annotated[Union[Annotated[Text, Tag("text")], Annotated[list[Text], Tag("texts")],
                         Annotated[list[TokenId], Tag("ids")],
                         Annotated[list[list[TokenId]], Tag("batch")]],
                   Discriminator(_prompt_kind)]


#: OpenAI's default ``max_tokens`` for completions (a null one included)
DEFAULT_MAX_TOKENS = 16


class CompletionRequest(SamplingFields):
    prompt: Prompt = Field(description="text, a list of one text, token ids, or a list of "
                           "one list of token ids")
    max_tokens: TokenCount = DEFAULT_MAX_TOKENS
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: Text | None = None

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _null_is_the_default(cls, v: Any) -> Any:
        # OpenAI: "max_tokens: integer or null, defaults to 16"; a null is not "no limit"
        return DEFAULT_MAX_TOKENS if v is None else v


def _prompt(body: CompletionRequest) -> tuple[str | None, list[int] | None]:
    """The prompt as text or as token ids (OpenAI accepts both; one prompt per request).

    Raises:
        APIError: 400 for several prompts, an empty prompt, echo or suffix.
    """
    prompt = body.prompt
    if isinstance(prompt, list) and not (prompt and isinstance(prompt[0], int)):
        # a list of texts or of token lists: OpenAI batches them, we take exactly one
        if len(prompt) != 1:
            raise APIError(400, "only one prompt per request is supported", param="prompt",
                           code="unsupported_value")
        prompt = prompt[0]
    if body.echo:
        raise APIError(400, "echo is not supported", param="echo", code="unsupported_value")
    if body.suffix:
        raise APIError(400, "suffix is not supported", param="suffix", code="unsupported_value")
    if isinstance(prompt, str):
        if not prompt:  # nothing to continue from (mlx-lm raised deep in generation)
            raise APIError(400, "prompt is empty", param="prompt", code="invalid_value")
        return prompt, None
    if not prompt:
        raise APIError(400, "prompt: the token list is empty", param="prompt",
                       code="invalid_value")
    return None, list(prompt)


def _logprobs(entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
        tokens.append(e.token)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries], "text_offset": offsets}


def to_engine_request(body: CompletionRequest, defaults: SamplingParams,
                      supports_tools: bool = False,
                      context_window: int | None = None,
                      media: MediaReader | None = None) -> ChatRequest:
    """Translate a validated completions request into the engine's raw-prompt
    :class:`ChatRequest` (no chat template; ``supports_tools``, ``context_window`` and
    ``media`` are not needed here: a prompt is text).

    Raises:
        APIError: 400 for n > 1, several prompts, an empty prompt, echo or suffix.
    """
    want_logprobs = body.logprobs is not None
    params = sampling(body, defaults, max_tokens=body.max_tokens, logprobs=want_logprobs,
                      top_logprobs=body.logprobs or 0)
    text, ids = _prompt(body)
    return ChatRequest(messages=[], prompt=text, prompt_ids=ids, params=params)


class CompletionRenderer(ChunkStream):
    """``text_completion`` chunks and body from the same text deltas (logprobs with each
    token's offset in the completion text)."""

    def __init__(self, base: dict[str, Any], *, include_usage: bool, logprobs: bool) -> None:
        super().__init__(base, include_usage)
        self.want_logprobs = logprobs
        self.deltas: list[TextDelta] = []
        self.offset = 0

    def _chunk(self, text: str, lp: Any, finish: str | None) -> dict:
        return sse.data({**self.base, "choices": [
            {"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]})

    def add(self, ev: Any) -> list:
        if not isinstance(ev, TextDelta):
            return []
        self.deltas.append(ev)
        lp = _logprobs(list(ev.logprobs), self.offset) if self.want_logprobs else None
        self.offset += len(ev.text)
        return [self._chunk(ev.text, lp, None)]

    def last_chunk(self, fin: Finished) -> dict:
        return self._chunk("", None, fin.finish_reason)

    def final(self, fin: Finished | None) -> dict:
        return {**self.base, "choices": [{
            "text": "".join(e.text for e in self.deltas), "index": 0,
            "logprobs": _logprobs([lp for e in self.deltas for lp in e.logprobs], 0)
            if self.want_logprobs else None,
            "finish_reason": finish_reason(fin)}], "usage": usage(fin)}


def _base(req: ChatRequest, started: Started) -> dict[str, Any]:
    return {"id": req.request_id, "object": "text_completion", "created": int(time.time()),
            "model": started.model, "system_fingerprint": "mlx-kit"}


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    req, started, events = await begin(request, body.model, body, to_engine_request, "cmpl-")
    renderer = CompletionRenderer(_base(req, started), logprobs=body.logprobs is not None,
                                  include_usage=bool(body.stream_options
                                                     and body.stream_options.include_usage))
    return await respond(request, events, renderer, stream=body.stream,
                         fields=COMPLETIONS_FIELDS)


PROTOCOL = Protocol("openai-completions", router, under("/v1/completions"))
