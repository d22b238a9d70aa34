"""POST /v1/completions (OpenAI's legacy text completions), streaming (SSE) and not."""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Union

from fastapi import APIRouter, Request
from pydantic import Discriminator, Field, StrictInt, Tag
from sse_starlette.sse import EventSourceResponse

from kit.engine.types import ChatRequest, Finished, TextDelta, TokenLogprob
from kit.server.content import Text
from kit.server.errors import APIError
from kit.server.openai_common import (
    MAX_TOKENS,
    SamplingFields,
    collect,
    sampling,
    start,
    stream_events,
    usage,
)
from kit.server.state import ServerState

router = APIRouter()


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


class CompletionRequest(SamplingFields):
    prompt: Prompt = Field(description="text, a list of one text, token ids, or a list of "
                           "one list of token ids")
    max_tokens: int | None = Field(default=16, ge=1, le=MAX_TOKENS)  # OpenAI's default here
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: Text | None = None


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


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state: ServerState = request.app.state.kit
    model = await state.resolve(body.model)
    want_logprobs = body.logprobs is not None
    params = sampling(body, state.sampling_defaults(), max_tokens=body.max_tokens,
                      logprobs=want_logprobs, top_logprobs=body.logprobs or 0)
    completion_id = f"cmpl-{uuid.uuid4().hex[:24]}"
    text, ids = _prompt(body)
    req = ChatRequest(messages=[], prompt=text, prompt_ids=ids, params=params, model=model,
                      request_id=completion_id)
    started, events = await start(state, req)
    base = {"id": completion_id, "object": "text_completion", "created": int(time.time()),
            "model": started.model, "system_fingerprint": "mlx-kit"}

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def sse():
            offset = 0
            async for ev in stream_events(events):
                if isinstance(ev, TextDelta):
                    lp = _logprobs(list(ev.logprobs), offset) if want_logprobs else None
                    offset += len(ev.text)
                    yield {"data": json.dumps({**base, "choices": [
                        {"text": ev.text, "index": 0, "logprobs": lp, "finish_reason": None}]})}
                elif isinstance(ev, Finished):
                    yield {"data": json.dumps({**base, "choices": [
                        {"text": "", "index": 0, "logprobs": None,
                         "finish_reason": ev.finish_reason}]})}
                    if include_usage:
                        yield {"data": json.dumps({**base, "choices": [], "usage": usage(ev)})}
                elif isinstance(ev, APIError):
                    yield {"data": json.dumps(ev.body())}
            yield {"data": "[DONE]"}

        return EventSourceResponse(sse(), ping=15)

    got, fin = await collect(request, events)
    deltas = [e for e in got if isinstance(e, TextDelta)]
    return {**base, "choices": [{
        "text": "".join(e.text for e in deltas), "index": 0,
        "logprobs": _logprobs([lp for e in deltas for lp in e.logprobs], 0)
        if want_logprobs else None,
        "finish_reason": fin.finish_reason if fin else "stop"}], "usage": usage(fin)}
