"""What every protocol's router shares to run a request: its router (which maps the one
error tree to the protocol's field names), the preamble (resolve the model, translate,
queue, wait for ``Started``), and the driver that feeds the engine's events to the
protocol's one :class:`Renderer`, streamed or not.

A protocol module is its request models, one pure ``to_engine_request`` and one renderer;
the handler is then::

    req, started, events = await begin(request, body.model, body, to_engine_request, "x-")
    return await respond(request, events, MyRenderer(started, ...), stream=body.stream,
                         fields=FIELDS)
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Mapping

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from kit.engine.types import ChatRequest, EngineError, Finished, Started
from kit.errors import KitError
from kit.server import sse
from kit.server.content.media import MediaReader
from kit.server.errors import APIError, api_error
from kit.server.state import SAMPLING_FIELDS, ServerState
from kit.server.stable_prompts import stable_messages
from kit.server.translate import new_id

#: A protocol's names for the engine's neutral field names (``schema`` ->
#: ``response_format``...), by first dotted segment (:func:`kit.server.errors.api_error`).
Fields = Mapping[str, str]

#: ``to_engine_request(body, defaults, *, supports_tools, context_window, media) ->
#: ChatRequest`` (``media``: the request's :class:`~kit.server.content.media.MediaReader`)
Translate = Callable[..., ChatRequest]


def protocol_router(fields: Fields) -> APIRouter:
    """An ``APIRouter`` whose routes answer every error of the one error tree that their
    handler raises (the engine's, the translation's ``InvalidRequest``) as the API error
    ``api_error(e, fields)``: status and code from its type, ``param`` in the protocol's
    own field names. Handlers need no try/except of their own."""

    class ProtocolRoute(APIRoute):
        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def run(request: Request) -> Any:
                try:
                    return await handler(request)
                except KitError as e:
                    raise api_error(e, dict(fields)) from None

            return run

    return APIRouter(route_class=ProtocolRoute)


class Renderer:
    """Turns one request's engine events into a protocol's output. The same object and the
    same :meth:`add` serve both ways, so streamed and non-streamed bodies cannot drift:

    - streamed: ``opening()``, ``add(event)`` for each TextDelta / ReasoningDelta /
      ToolCall, then ``finish(Finished)`` or ``error(APIError)`` (an engine error after the
      headers went out), then ``closing()``; each returns the frames to send (for SSE,
      :mod:`kit.server.sse` dicts);
    - not streamed: ``add(event)`` for each event (frames discarded), then ``final(fin)``,
      the body (``fin`` None only if the engine ended without ``Finished``).
    """

    def opening(self) -> list:
        return []

    def add(self, event: Any) -> list:
        raise NotImplementedError

    def finish(self, fin: Finished) -> list:
        raise NotImplementedError

    def error(self, e: APIError) -> list:
        raise NotImplementedError

    def closing(self) -> list:
        return []

    def final(self, fin: Finished | None) -> Any:
        raise NotImplementedError


async def begin(request: Request, model: str, body: Any, translate: Translate,
                id_prefix: str, stream: bool | None = None
                ) -> tuple[ChatRequest, Started, AsyncIterator]:
    """The preamble of every generating route: resolve ``model`` (which may swap; ``local:NAME``
    runs ``local`` with LoRA adapter NAME), translate
    ``body`` with the then loaded model's sampling defaults, tool support, context
    window and image support (``media``: :meth:`ServerState.media_reader`; on a worker
    thread when the model takes images, :func:`off_loop`), put known agents' moved prompt
    blocks back (:mod:`kit.server.stable_prompts`),
    give the request an id (``id_prefix`` + 24 hex digits; ``req.request_id``), and
    :func:`start` it. ``stream``: whether the answer is streamed, for the status page
    (default: ``body.stream``; Gemini chooses by route and passes it).

    Raises:
        APIError: 404 for an unknown model, or the translation's own 400.
        KitError: the translation's or the engine's (mapped by :func:`protocol_router`).
    """
    state: ServerState = request.app.state.kit
    model, adapter = state.split_adapter(model)
    real = await state.resolve(model)
    defaults = state.sampling_defaults()
    media = state.media_reader()
    req = await off_loop(media, translate, body, defaults,
                         supports_tools=state.engine.capabilities()["tools"],
                         context_window=state.engine.model_info.context_window, media=media)
    if state.force_sampling:  # the server's sampling, whatever the request set
        req.params = replace(req.params, **{k: getattr(defaults, k) for k in SAMPLING_FIELDS})
    req.model, req.adapter, req.request_id = real, adapter, new_id(id_prefix)
    req.messages = stable_messages(req.messages)  # known agents' moved blocks, put back
    activity = getattr(request.app.state, "activity", None)  # the status page and /metrics
    if activity is None:
        started, events = await start(state, req)
    else:
        started, events = await activity.watch(
            request.headers, request.url.path, req.request_id, real or state.model_id,
            bool(getattr(body, "stream", False)) if stream is None else stream,
            start(state, req))
    request.state.started = started  # respond() reports a memory clamp from it
    return req, started, events


async def off_loop(reader: MediaReader, fn: Callable[..., Any], /, *args: Any,
                   **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``: on a worker thread when the loaded model takes images
    (``reader.vision``: reading them decodes every pixel, up to --max-images x
    --max-image-pixels, which must not stall the event loop), else here as before."""
    if reader.vision:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


#: The response header that reports a ``max_tokens`` capped by memory admission, on every
#: protocol, streamed or not (the headers go out after ``Started``, which carries the cap).
MAX_TOKENS_HEADER = "X-Mlx-Kit-Max-Tokens"


def clamp_headers(started: Started | None) -> dict[str, str]:
    """``{MAX_TOKENS_HEADER: "812 (clamped from 100000: memory)"}`` when memory admission
    capped the request's ``max_tokens`` (see docs/server.md "Memory"), else ``{}``."""
    if started is None or started.clamped_from is None:
        return {}
    return {MAX_TOKENS_HEADER: f"{started.max_tokens} (clamped from {started.clamped_from}: "
                               f"memory)"}


async def start(state: ServerState, req: ChatRequest) -> tuple[Started, AsyncIterator]:
    """Queue ``req`` and wait for its ``Started`` event, so that a request the engine
    rejects (bad template, context exceeded, model not loaded) gets a real 4xx/5xx status
    instead of a broken stream. Returns the event and the iterator of the rest.

    Raises:
        EngineError: the engine's refusal (mapped by :func:`protocol_router`).
    """
    events = state.engine.generate(req)
    started = await anext(events)
    if not isinstance(started, Started):  # the engine's contract: Started comes first
        raise APIError(500, "engine protocol error", type="server_error")
    return started, events


async def collect(request: Request, events: AsyncIterator) -> tuple[list, Finished | None]:
    """All events of a non-streamed request, cancelling generation if the client hangs up.

    Raises:
        EngineError: the engine's error (mapped by :func:`protocol_router`).
        APIError: 499 when the client went away.
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
    return task.result()


async def stream_events(events: AsyncIterator, fields: Fields) -> AsyncIterator:
    """The events of a streamed request; an engine error after the headers went out
    becomes an ``APIError`` item (in the protocol's ``fields``) to render in the stream."""
    try:
        async with aclosing(events):
            async for ev in events:
                yield ev
    except EngineError as e:
        yield api_error(e, dict(fields))


async def frames(renderer: Renderer, events: AsyncIterator, fields: Fields) -> AsyncIterator:
    """The streamed frames of ``renderer`` for ``events`` (see :class:`Renderer`)."""
    for f in renderer.opening():
        yield f
    async for ev in stream_events(events, fields):
        out = renderer.error(ev) if isinstance(ev, APIError) else \
            renderer.finish(ev) if isinstance(ev, Finished) else renderer.add(ev)
        for f in out:
            yield f
    for f in renderer.closing():
        yield f


async def respond(request: Request, events: AsyncIterator, renderer: Renderer, *,
                  stream: bool, fields: Fields,
                  wrap: Callable[[AsyncIterator], Any] = sse.response) -> Any:
    """The response to a started request: ``wrap`` (default: SSE) around the renderer's
    frames when ``stream``, else the renderer's final body once generation ended.

    Raises:
        EngineError: the engine's error before any byte went out (non-streamed).
        APIError: 499 when a non-streamed request's client went away.
    """
    headers = clamp_headers(getattr(request.state, "started", None))
    if stream:
        response = wrap(frames(renderer, events, fields))
        response.headers.update(headers)
        return response
    got, fin = await collect(request, events)
    for ev in got:
        renderer.add(ev)
    body = renderer.final(fin)
    if headers and not isinstance(body, Response):  # a plain body: FastAPI's JSON, + header
        return JSONResponse(jsonable_encoder(body), headers=headers)
    if headers:
        body.headers.update(headers)
    return body


__all__ = ["MAX_TOKENS_HEADER", "Fields", "Renderer", "begin", "clamp_headers", "collect", "frames",
           "off_loop", "protocol_router", "respond", "start", "stream_events"]
