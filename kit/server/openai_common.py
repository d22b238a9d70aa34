"""What the OpenAI routers (chat/completions, completions) share: the sampling fields,
their translation to the engine, usage, error mapping, and running a request."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Annotated, Any, AsyncIterator

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

from kit.engine.types import (
    ChatRequest,
    EngineError,
    Finished,
    SamplingParams,
    Started,
)
from kit.server.content import Id, Text, either, excerpt
from kit.server.errors import APIError, api_error
from kit.server.state import ServerState


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are accepted and ignored


class StreamOptions(Open):
    include_usage: bool = False


MAX_TOKENS = 2**31 - 1  # token counts beyond an int32 are mistakes, not requests
MAX_STOPS = 64  # stop strings (OpenAI allows 4; agents send a few more)
MAX_LOGIT_BIAS = 1024  # logit_bias entries
TokenKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]


def number(lo: float, hi: float | None = None, *, above: bool = False) -> Any:
    """A finite float field defaulting to None, in [lo, hi] (``above``: (lo, hi])."""
    bounds = {"gt": lo} if above else {"ge": lo}
    return Field(default=None, le=hi, allow_inf_nan=False, **bounds)


class SamplingFields(Open):
    """Request fields both OpenAI text endpoints accept, in the ranges OpenAI's API
    documents (top_k and min_p are extensions)."""

    model: Id
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
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
        stop=tuple(s for s in stop if s),
        seed=body.seed,
        logprobs=logprobs,
        top_logprobs=top_logprobs if logprobs else 0,
    )


def choose_tools(tools: list[dict[str, Any]], kind: str, name: str | None,
                 supports_tools: bool) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The tools to hand the chat template (OpenAI function schemas) and the call to
    force (``ChatRequest.force_tool``), for every protocol.

    ``kind``: ``none`` hides the tools; ``auto`` passes them all and lets the model decide;
    ``required`` forces a call to one of them (force ``""``); ``named`` forces a call to
    ``name``. The template always gets every tool, so the prompt (and its cache) does not
    change with ``tool_choice``. Tools sent to a model without tool support reach its
    template, which ignores them (``capabilities.tools`` in /v1/models says so).

    The tools are already validated by the protocol's request model
    (:mod:`kit.server.content`).

    Raises:
        APIError: 400 for a forced call without tools, on a model without tool support,
            or naming a tool that is not in ``tools``.
    """
    if kind not in ("auto", "none", "required", "named"):
        raise APIError(400, f"tool_choice {excerpt(kind)} is not supported (auto, none, required, "
                       "or a function)", param="tool_choice", code="invalid_value")
    if kind in ("required", "named") and not tools:
        raise APIError(400, "tool_choice requires a tool call, but no (function) tools were "
                       "given", param="tool_choice", code="invalid_value")
    if not tools or kind == "none":
        return None, None
    if kind == "auto":
        return tools, None
    if not supports_tools:
        raise APIError(400, "tool_choice requires a tool call, but the loaded model's chat "
                       "template has no tool-call support", param="tool_choice",
                       code="unsupported_value")
    if kind == "required":
        return tools, ""
    if not isinstance(name, str) or not name:
        raise APIError(400, "tool_choice must name a function", param="tool_choice",
                       code="invalid_value")
    if not any(t["function"]["name"] == name for t in tools):
        raise APIError(400, f"tool_choice names {excerpt(name)}, which is not in tools",
                       param="tool_choice", code="invalid_value")
    return tools, name


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
    """OpenAI's usage object (with ``prompt_tokens_details.cached_tokens``)."""
    if fin is None:
        return None
    u = fin.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


# OpenAI's names for the engine's neutral field names (the other fields are the same).
OPENAI_FIELDS = {"schema": "response_format", "template_kwargs": "chat_template_kwargs"}


def engine_error(e: EngineError, fields: dict[str, str] | None = None) -> APIError:
    """Map an engine error to the API error a client sees (see ``errors.api_error``);
    ``fields`` defaults to OpenAI's field names."""
    return api_error(e, OPENAI_FIELDS if fields is None else fields)


async def start(state: ServerState, req: ChatRequest) -> tuple[Started, AsyncIterator]:
    """Queue ``req`` and wait for its ``Started`` event, so that a request the engine
    rejects (bad template, context exceeded, model not loaded) gets a real 4xx/5xx status
    instead of a broken stream. Returns the event and the iterator of the rest."""
    events = state.engine.generate(req)
    try:
        started = await anext(events)
    except EngineError as e:
        raise engine_error(e) from None
    if not isinstance(started, Started):  # the engine's contract: Started comes first
        raise APIError(500, "engine protocol error", type="server_error")
    return started, events


async def collect(request: Request, events: AsyncIterator) -> tuple[list, Finished | None]:
    """All events of a non-streamed request, cancelling generation if the client hangs up.

    Raises:
        APIError: the engine's error, or 499 when the client went away.
    """
    async def run() -> tuple[list, Finished | None]:
        got, fin = [], None
        async with aclosing(events):
            async for ev in events:
                if isinstance(ev, Finished):
                    fin = ev
                else:
                    got.append(ev)
        return got, fin

    task = asyncio.ensure_future(run())
    try:
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if not done and await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client closed the request")
    except asyncio.CancelledError:  # e.g. the server's shutdown: stop generating too
        task.cancel()
        raise
    try:
        return task.result()
    except EngineError as e:
        raise engine_error(e) from None


async def stream_events(events: AsyncIterator) -> AsyncIterator:
    """The events of a streamed request; an engine error after the headers went out
    becomes an ``APIError`` item for the router to render inside the stream."""
    try:
        async with aclosing(events):
            async for ev in events:
                yield ev
    except EngineError as e:
        yield engine_error(e)
