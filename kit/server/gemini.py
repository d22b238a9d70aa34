"""The Gemini API (``v1beta``): ``POST /v1beta/models/{model}:generateContent``,
``:streamGenerateContent`` (``?alt=sse``, or a streamed JSON array without it),
``:countTokens`` (the same three under ``/v1``) — what Gemini CLI and the google-genai SDKs
speak — and, from :mod:`kit.server.gemini_catalog`, ``GET /v1beta/models`` (+ ``/{model}``).

The protocol is three modules, like every other one in shape: the bodies
(:mod:`kit.server.gemini_schemas`), one translation into the engine's ChatRequest
(:mod:`kit.server.gemini_translate`), and here one renderer of the engine's events and the
routes. Errors have Google's shape ``{"error": {"code", "message", "status"}}``
(kit/server/errors.py), fields named as Gemini names them (``GEMINI_FIELDS``).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from kit.engine.types import (
    ChatRequest,
    Finished,
    ReasoningDelta,
    Started,
    TextDelta,
    ToolCall,
)
from kit.server import gemini_catalog
from kit.server.adapter import Renderer, begin, off_loop, protocol_router, respond
from kit.server.errors import APIError
from kit.server.gemini_schemas import CountTokensRequest, GenerateContentRequest
from kit.server.gemini_translate import (
    GEMINI_FIELDS,
    bad_field,
    chat_messages,
    chat_tools,
    to_engine_request,
)
from kit.server.protocol import Protocol
from kit.server.state import ServerState
from kit.server.translate import call_arguments, with_media

router = protocol_router(GEMINI_FIELDS)

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "cancelled": "STOP"}


def _usage(fin: Finished | None, prompt: int = 0, cached: int = 0) -> dict[str, Any]:
    """Gemini's ``usageMetadata``; at the end (``fin``) with the prompt's tokens per
    modality: a vision model's image and audio placeholder tokens apart from the text's."""
    if fin is None:  # a chunk before the end: the counts per modality come with the last
        return {"promptTokenCount": prompt, "candidatesTokenCount": 0,
                "totalTokenCount": prompt, "cachedContentTokenCount": cached}
    u = fin.usage
    p, c, images, audio = u.prompt_tokens, u.completion_tokens, u.image_tokens, u.audio_tokens
    details = [{"modality": "TEXT", "tokenCount": p - images - audio}]
    details += [{"modality": m, "tokenCount": n} for m, n in (("IMAGE", images),
                                                                 ("AUDIO", audio)) if n]
    return {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c,
            "cachedContentTokenCount": u.cached_tokens, "promptTokensDetails": details}


def _part(ev: Any, thoughts: bool) -> dict[str, Any] | None:
    """The part an engine event becomes (None: not shown)."""
    if isinstance(ev, TextDelta):
        return {"text": ev.text}
    if isinstance(ev, ReasoningDelta):
        return {"text": ev.text, "thought": True} if thoughts else None
    if isinstance(ev, ToolCall):
        args = call_arguments(ev)
        return {"functionCall": {"id": ev.id, "name": ev.name,
                                 "args": args if isinstance(args, dict) else {"value": args}}}
    return None


class GeminiRenderer(Renderer):
    """``GenerateContentResponse`` chunks and the whole response from the same events.
    A stream holds back its last content chunk until Finished, which it carries with
    ``finishReason`` and the usage: Gemini CLI treats a final chunk with an empty text part
    as an invalid response. The whole response merges neighbouring text parts."""

    def __init__(self, base: dict[str, Any], started: Started, thoughts: bool) -> None:
        self.base, self.started, self.thoughts = base, started, thoughts
        self.parts: list[dict[str, Any]] = []
        self.held: list[dict[str, Any]] | None = None

    def _response(self, parts: list[dict[str, Any]], fin: Finished | None = None,
                  last: bool = False) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if last:
            candidate["finishReason"] = _FINISH.get(fin.finish_reason if fin else "stop",
                                                    "STOP")
        usage = _usage(fin) if fin else _usage(None, self.started.prompt_tokens,
                                               self.started.cached_tokens)
        return {"candidates": [candidate], "usageMetadata": usage, **self.base}

    def add(self, ev: Any) -> list:
        part = _part(ev, self.thoughts)
        if part is None:
            return []
        last = self.parts[-1] if self.parts else None
        if last is not None and "text" in part and "text" in last \
                and part.get("thought") == last.get("thought"):
            last["text"] += part["text"]
        else:
            self.parts.append(dict(part))  # a copy: merging must not change a held chunk
        out = [self._response(self.held)] if self.held is not None else []
        self.held = [part]
        return out

    def finish(self, fin: Finished) -> list:
        return [self._response(self.held if self.held is not None else [{"text": ""}], fin,
                               last=True)]

    def error(self, e: APIError) -> list:
        return [{"error": error_body(e)["error"]}]

    def final(self, fin: Finished | None) -> dict:
        return self._response(self.parts or [{"text": ""}], fin, last=True)


def _sse(chunks):
    # Plain SSE data lines and no keep-alive comments: the @google/genai JS SDK (Gemini
    # CLI) parses only "data:" lines, and a ": ping" line stalls its parser (the CLI
    # then retried every answer that took longer than the ping interval).
    async def lines():
        async for c in chunks:
            yield "data: " + json.dumps(c, ensure_ascii=False) + "\r\n\r\n"

    return StreamingResponse(lines(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _array(chunks):
    async def items():  # without alt=sse Google streams one JSON array of responses
        first = True
        async for c in chunks:
            yield ("[" if first else ",\n") + json.dumps(c, ensure_ascii=False)
            first = False
        yield "[]" if first else "]"

    return StreamingResponse(items(), media_type="application/json")


async def _generate(model: str, body: GenerateContentRequest, request: Request,
                    stream: bool):
    # Gemini picks streaming by route, not by a body field: say which for the status page
    req, started, events = await begin(request, model.removeprefix("models/"), body,
                                       to_engine_request, "", stream=stream)
    g = body.generation_config
    thoughts = bool(g and g.thinking_config and g.thinking_config.include_thoughts)
    renderer = GeminiRenderer({"modelVersion": started.model, "responseId": req.request_id},
                              started, thoughts)
    return await respond(request, events, renderer, stream=stream, fields=GEMINI_FIELDS,
                         wrap=_sse if request.query_params.get("alt") == "sse" else _array)


async def generate_content(model: str, body: GenerateContentRequest, request: Request):
    return await _generate(model, body, request, stream=False)


async def stream_generate_content(model: str, body: GenerateContentRequest, request: Request):
    return await _generate(model, body, request, stream=True)


async def count_tokens(model: str, body: CountTokensRequest, request: Request) -> dict:
    state: ServerState = request.app.state.kit
    await state.resolve(model.removeprefix("models/"))
    if body.generate_content_request is not None:
        if body.contents:
            raise bad_field("set contents or generateContentRequest, not both", "contents")
        inner = body.generate_content_request
        tools = chat_tools(inner, state.engine.capabilities()["tools"])[0]
    elif body.contents:
        inner, tools = GenerateContentRequest(contents=body.contents), None
    else:
        raise bad_field("contents or generateContentRequest is required", "contents")
    media = state.media_reader()
    messages = await off_loop(media, chat_messages, inner, media)
    n = await state.count_tokens(ChatRequest(**with_media(messages), tools=tools))
    return {"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}


# Google serves the same methods under v1beta (Gemini CLI) and v1 (the SDKs' default).
for _version in ("v1beta", "v1"):
    for _method, _handler in (("generateContent", generate_content),
                              ("streamGenerateContent", stream_generate_content),
                              ("countTokens", count_tokens)):
        router.add_api_route(f"/{_version}/models/{{model:path}}:{_method}", _handler,
                             methods=["POST"])
# After the methods: the listing and the 404 for every other method
router.include_router(gemini_catalog.router)


#: the model methods Google's API documents: under /v1 only these make a path Gemini's
#: (``/v1/models/local:sql`` is OpenAI's retrieve-model of a LoRA adapter)
_GOOGLE_METHODS = frozenset({"generateContent", "streamGenerateContent", "countTokens",
                             "embedContent", "batchEmbedContents", "batchGenerateContent",
                             "asyncBatchEmbedContent", "predict", "predictLongRunning"})


def is_gemini_path(path: str) -> bool:
    """Whether ``path`` is a Gemini API route: under /v1beta, or a Gemini method on a
    model under /v1 (``/v1/models/local:generateContent``, the SDKs' stable version)."""
    return path.startswith("/v1beta/") or path == "/v1beta" or (
        path.startswith("/v1/models/") and path.rpartition(":")[2] in _GOOGLE_METHODS)


# google.rpc.Code names by HTTP status (Gemini API errors)
_GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                  404: "NOT_FOUND", 405: "UNIMPLEMENTED", 409: "ABORTED",
                  413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
                  500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
                  504: "DEADLINE_EXCEEDED", 507: "RESOURCE_EXHAUSTED"}


def error_body(e: APIError) -> dict:
    """Google's error object (``{"error": {"code", "message", "status", "details"}}``,
    the field at fault as a ``google.rpc.BadRequest`` field violation)."""
    status = _GOOGLE_STATUS.get(e.status, "INTERNAL" if e.status >= 500 else "INVALID_ARGUMENT")
    error: dict = {"code": e.status, "message": e.message, "status": status}
    if e.param:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                             "fieldViolations": [{"field": e.param,
                                                  "description": e.message}]}]
    return {"error": error}


#: Google's two ways to send the key: the ``x-goog-api-key`` header and ``?key=``.
PROTOCOL = Protocol("gemini", router, is_gemini_path, error_body=error_body,
                    key_headers=("x-goog-api-key",), key_query=("key",))
