"""The Gemini API (``v1beta``): ``POST /v1beta/models/{model}:generateContent``,
``:streamGenerateContent`` (``?alt=sse``, or a streamed JSON array without it),
``:countTokens`` (the same three under ``/v1``), ``GET /v1beta/models`` (+ ``/{model}``)
— what Gemini CLI and the google-genai SDKs speak. A thin adapter over the engine's events, like the other routers.

Requests become the engine's chat messages: ``systemInstruction`` -> a system message;
``model`` turns -> assistant messages (``functionCall`` parts -> ``tool_calls``, ``thought``
parts dropped); ``functionResponse`` parts -> ``tool`` messages. ``toolConfig`` goes to the
shared forced-tool-call machinery (ANY -> required / named), a JSON ``responseMimeType``
with ``responseSchema`` / ``responseJsonSchema`` to constrained decoding. What a local
text-only server cannot honour (media, Google-side tools, ``cachedContent``,
``candidateCount`` > 1, logprobs, audio output) is a 400 naming the field; errors have
Google's shape ``{"error": {"code", "message", "status"}}`` (kit/server/errors.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from kit import STABLE_MODEL_ID
from kit.engine.types import (
    ChatRequest,
    EngineError,
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCall,
)
from kit.server.errors import APIError
from kit.server.gemini_schemas import (
    SERVER_TOOLS,
    Content,
    CountTokensRequest,
    GenerateContentRequest,
    GenerationConfig,
    to_json_schema,
)
from kit.server.openai_common import choose_tools, collect, engine_error, start, stream_events
from kit.server.state import ServerState

router = APIRouter()


class _RedactKey(logging.Filter):
    """Google's ``?key=KEY`` would put the API key into uvicorn's access log: redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) \
                and "key=" in args[2]:
            path = re.sub(r"([?&]key=)[^&]*", r"\1REDACTED", args[2])
            record.args = (*args[:2], path, *args[3:])
        return True


logging.getLogger("uvicorn.access").addFilter(_RedactKey())

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "cancelled": "STOP"}
# The engine and the shared helpers name OpenAI's fields; a Gemini client sees its own.
_PARAMS = {"tool_choice": "toolConfig.functionCallingConfig", "tools": "tools",
           "response_format": "generationConfig.responseJsonSchema", "top_k": "generationConfig.topK",
           "messages": "contents"}


def _bad(message: str, param: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


def _renamed(e: APIError) -> APIError:
    """``e`` with a Gemini field name instead of an OpenAI one."""
    if e.param:
        head = e.param.split("[")[0].split(".")[0]
        if head in _PARAMS:
            e.param = _PARAMS[head]
    return e


def _refuse_media(part: Any, where: str) -> None:
    for field in ("inline_data", "file_data", "executable_code", "code_execution_result"):
        if getattr(part, field) is not None:
            name = {"inline_data": "inlineData", "file_data": "fileData",
                    "executable_code": "executableCode",
                    "code_execution_result": "codeExecutionResult"}[field]
            raise _bad(f"{name} parts are not supported by this local text-only model",
                       f"{where}.{name}", code="unsupported_content")


def _system(content: Content | None) -> list[dict[str, Any]]:
    if content is None:
        return []
    texts = []
    for j, p in enumerate(content.parts):
        _refuse_media(p, f"systemInstruction.parts.{j}")
        if p.text is not None and not p.thought:
            texts.append(p.text)
    return [{"role": "system", "content": "".join(texts)}] if texts else []


def _response_text(response: dict[str, Any] | None) -> str:
    """A function result as the tool message's text: Gemini CLI's ``{"output": "..."}``
    as its string, anything else as compact JSON."""
    if isinstance(response, dict) and set(response) == {"output"} \
            and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response or {}, ensure_ascii=False, separators=(",", ":"))


def _messages(body: GenerateContentRequest) -> list[dict[str, Any]]:
    """The chat messages for ``body`` (see the module docstring).

    Raises:
        APIError: 400 for media parts, a functionCall outside a model turn, a
            functionResponse inside one.
    """
    out = _system(body.system_instruction)
    open_calls: dict[str, list[str]] = {}  # name -> ids of calls without a response yet
    for i, c in enumerate(body.contents):
        texts: list[str] = []
        if c.role == "model":
            calls = []
            for j, p in enumerate(c.parts):
                where = f"contents.{i}.parts.{j}"
                _refuse_media(p, where)
                if p.function_response is not None:
                    raise _bad("functionResponse parts belong in a user turn",
                               f"{where}.functionResponse")
                if p.function_call is not None:
                    fc = p.function_call
                    call_id = fc.id or f"call_{i}_{j}"
                    open_calls.setdefault(fc.name, []).append(call_id)
                    calls.append({"id": call_id, "type": "function",
                                  "function": {"name": fc.name, "arguments": fc.args or {}}})
                elif p.text is not None and not p.thought:
                    texts.append(p.text)
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        answered = False
        for j, p in enumerate(c.parts):
            where = f"contents.{i}.parts.{j}"
            _refuse_media(p, where)
            if p.function_call is not None:
                raise _bad("functionCall parts belong in a model turn", f"{where}.functionCall")
            if p.function_response is not None:
                fr = p.function_response
                if fr.parts:
                    raise _bad("multimodal function responses are not supported by this "
                               "local text-only model", f"{where}.functionResponse.parts",
                               code="unsupported_content")
                pending = open_calls.get(fr.name) or []
                call_id = fr.id if fr.id else (pending[0] if pending else f"call_{i}_{j}")
                if call_id in pending:
                    pending.remove(call_id)
                out.append({"role": "tool", "tool_call_id": call_id, "name": fr.name,
                            "content": _response_text(fr.response)})
                answered = True
            elif p.text is not None and not p.thought:
                texts.append(p.text)
        if texts or not answered:
            out.append({"role": "user", "content": "".join(texts)})
    return out


def _tools(body: GenerateContentRequest,
           supports_tools: bool) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The function declarations as chat-template tool schemas and the call to force
    (``toolConfig.functionCallingConfig``: AUTO / VALIDATED -> the model decides, NONE ->
    no tools, ANY -> a call to one of ``allowedFunctionNames`` or of all functions).

    Raises:
        APIError: 400 for a Google-side tool, a declaration with both parameter forms or a
            duplicate name, allowedFunctionNames outside mode ANY or naming an unknown
            function, a forced call on a model without tool support.
    """
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(body.tools or []):
        extra = tool.model_extra or {}
        for kind in SERVER_TOOLS:
            snake = "".join("_" + ch.lower() if ch.isupper() else ch for ch in kind)
            if extra.get(kind) is not None or extra.get(snake) is not None:
                raise _bad(f"{kind} runs on Google's servers and is not available on a "
                           "local server", f"tools.{i}.{kind}", code="unsupported_value")
        for k, d in enumerate(tool.function_declarations or []):
            where = f"tools.{i}.functionDeclarations.{k}"
            if d.parameters is not None and d.parameters_json_schema is not None:
                raise _bad("set parameters or parametersJsonSchema, not both", where)
            if any(t["function"]["name"] == d.name for t in tools):
                raise _bad(f"duplicate function name {d.name!r}", f"{where}.name")
            try:
                params = to_json_schema(d.parameters_json_schema if d.parameters is None
                                        else d.parameters)
            except ValueError as e:
                raise _bad(str(e), f"{where}.parameters") from None
            tools.append({"type": "function", "function": {
                "name": d.name, "description": d.description or "",
                "parameters": params or {"type": "object", "properties": {}}}})
    fcc = body.tool_config.function_calling_config if body.tool_config else None
    mode = fcc.mode if fcc else "AUTO"
    allowed = list(fcc.allowed_function_names or []) if fcc else []
    where = "toolConfig.functionCallingConfig.allowedFunctionNames"
    if allowed and mode != "ANY":
        raise _bad("allowedFunctionNames can only be set with mode ANY", where)
    for name in allowed:
        if not any(t["function"]["name"] == name for t in tools):
            raise _bad(f"{name!r} is not among the function declarations", where)
    if mode == "ANY" and len(allowed) > 1:  # a call to one of a subset: offer only those
        tools = [t for t in tools if t["function"]["name"] in allowed]
    kind = {"NONE": "none", "ANY": "named" if len(allowed) == 1 else "required"}.get(mode,
                                                                                   "auto")
    try:
        return choose_tools(tools, kind, allowed[0] if allowed else None, supports_tools)
    except APIError as e:
        raise _renamed(e) from None


def _schema(g: GenerationConfig) -> dict[str, Any] | None:
    """The JSON schema the answer must follow (None: free text).

    Raises:
        APIError: 400 for a schema without JSON mode, both schema fields, another MIME type.
    """
    mime = (g.response_mime_type or "text/plain").lower()
    given = g.response_json_schema if g.response_json_schema is not None else g.response_schema
    if mime == "text/plain":
        if given is not None:
            raise _bad("a response schema needs responseMimeType application/json",
                       "generationConfig.responseMimeType")
        return None
    if mime != "application/json":
        raise _bad(f"{g.response_mime_type!r} is not supported (text/plain, application/json)",
                   "generationConfig.responseMimeType", code="unsupported_value")
    if g.response_json_schema is not None and g.response_schema is not None:
        raise _bad("set responseSchema or responseJsonSchema, not both",
                   "generationConfig.responseSchema")
    try:
        return to_json_schema(given) if given else {"type": "object"}
    except ValueError as e:
        raise _bad(str(e), "generationConfig.responseSchema") from None


def _template_kwargs(g: GenerationConfig) -> dict[str, Any]:
    """``thinkingConfig`` as chat-template variables: a budget of 0 or level MINIMAL turns
    thinking off, a level becomes ``reasoning_effort``; nothing when neither is set."""
    tc = g.thinking_config
    if tc is None or (tc.thinking_budget is None and tc.thinking_level in
                      (None, "THINKING_LEVEL_UNSPECIFIED")):
        return {}
    kwargs: dict[str, Any] = {"enable_thinking": tc.thinking_budget != 0
                              and tc.thinking_level != "MINIMAL"}
    if tc.thinking_level not in (None, "THINKING_LEVEL_UNSPECIFIED"):
        kwargs["reasoning_effort"] = tc.thinking_level.lower()
    return kwargs


def to_engine_request(body: GenerateContentRequest, state: ServerState) -> ChatRequest:
    """Translate a ``generateContent`` body into the engine's :class:`ChatRequest`
    (sampling fields the body omits come from the server's defaults).

    Raises:
        APIError: 400 naming the field for what this server cannot honour.
    """
    g = body.generation_config or GenerationConfig()
    if body.cached_content:
        raise _bad("this server stores no cached contents; send the whole conversation",
                   "cachedContent", code="unsupported_value")
    if g.candidate_count is not None and g.candidate_count > 1:
        raise _bad("only 1 candidate is supported", "generationConfig.candidateCount",
                   code="unsupported_value")
    if any(m.upper() != "TEXT" for m in g.response_modalities or []):
        raise _bad("only TEXT output is supported", "generationConfig.responseModalities",
                   code="unsupported_value")
    for field, name in (("response_logprobs", "responseLogprobs"), ("logprobs", "logprobs"),
                        ("speech_config", "speechConfig")):
        if getattr(g, field):
            raise _bad("not supported by this server", f"generationConfig.{name}",
                       code="unsupported_value")
    window = state.engine.model_info.context_window
    params = replace(
        state.sampling_defaults(),
        # a cap, as in Google's API: the engine fits an omitted one to the context window
        max_tokens=None if g.max_output_tokens is None or g.max_output_tokens >= window
        else g.max_output_tokens,
        stop=tuple(s for s in g.stop_sequences or () if s),
        seed=g.seed, presence_penalty=g.presence_penalty,
        frequency_penalty=g.frequency_penalty,
        **{k: v for k, v in (("temperature", g.temperature), ("top_p", g.top_p),
                             ("top_k", g.top_k)) if v is not None})
    tools, force = _tools(body, state.engine.capabilities()["tools"])
    return ChatRequest(messages=_messages(body), params=params, tools=tools, force_tool=force,
                       response_schema=_schema(g), template_kwargs=_template_kwargs(g))


def _usage(fin: Finished | None, prompt: int = 0, cached: int = 0) -> dict[str, Any]:
    u = fin.usage if fin else None
    p, c = (u.prompt_tokens, u.completion_tokens) if u else (prompt, 0)
    return {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c,
            "cachedContentTokenCount": u.cached_tokens if u else cached,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": p}]}


def _call_part(call: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = {"_raw": call.arguments}
    return {"functionCall": {"id": call.id, "name": call.name,
                             "args": args if isinstance(args, dict) else {"value": args}}}


def _part(ev: Any, thoughts: bool) -> dict[str, Any] | None:
    """The part an engine event becomes (None: not shown)."""
    if isinstance(ev, TextDelta):
        return {"text": ev.text}
    if isinstance(ev, ReasoningDelta):
        return {"text": ev.text, "thought": True} if thoughts else None
    if isinstance(ev, ToolCall):
        return _call_part(ev)
    return None


async def _generate(model: str, body: GenerateContentRequest, request: Request,
                    stream: bool):
    state: ServerState = request.app.state.kit
    req = to_engine_request(body, state)
    req.model = await state.resolve(model.removeprefix("models/"))
    req.request_id = response_id = uuid.uuid4().hex[:24]
    try:
        started, events = await start(state, req)
    except APIError as e:
        raise _renamed(e) from None
    g = body.generation_config
    thoughts = bool(g and g.thinking_config and g.thinking_config.include_thoughts)
    base = {"modelVersion": started.model, "responseId": response_id}

    def response(parts: list[dict[str, Any]], fin: Finished | None = None,
                 last: bool = False) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if last:
            candidate["finishReason"] = _FINISH.get(fin.finish_reason if fin else "stop",
                                                    "STOP")
        usage = _usage(fin) if fin else _usage(None, started.prompt_tokens,
                                               started.cached_tokens)
        return {"candidates": [candidate], "usageMetadata": usage, **base}

    if not stream:
        got, fin = await collect(request, events)
        parts: list[dict[str, Any]] = []
        for ev in got:
            part = _part(ev, thoughts)
            if part is None:
                continue
            if parts and "text" in part and "text" in parts[-1] \
                    and part.get("thought") == parts[-1].get("thought"):
                parts[-1]["text"] += part["text"]
            else:
                parts.append(part)
        return response(parts or [{"text": ""}], fin, last=True)

    async def chunks():
        # The last content chunk waits for Finished and carries finishReason and the usage:
        # Gemini CLI treats a final chunk with an empty text part as an invalid response.
        held: list[dict[str, Any]] | None = None
        async for ev in stream_events(events):
            if isinstance(ev, APIError):
                yield {"error": gemini_error(_renamed(ev))}
                return
            if isinstance(ev, Finished):
                yield response(held if held is not None else [{"text": ""}], ev, last=True)
                return
            part = _part(ev, thoughts)
            if part is None:
                continue
            if held is not None:
                yield response(held)
            held = [part]

    if request.query_params.get("alt") == "sse":
        # Plain SSE data lines and no keep-alive comments: the @google/genai JS SDK (Gemini
        # CLI) parses only "data:" lines, and a ": ping" line stalls its parser (the CLI
        # then retried every answer that took longer than the ping interval).
        async def sse():
            async for c in chunks():
                yield "data: " + json.dumps(c, ensure_ascii=False) + "\r\n\r\n"

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def array():  # without alt=sse Google streams one JSON array of responses
        first = True
        async for c in chunks():
            yield ("[" if first else ",\n") + json.dumps(c, ensure_ascii=False)
            first = False
        yield "[]" if first else "]"

    return StreamingResponse(array(), media_type="application/json")


def gemini_error(e: APIError) -> dict[str, Any]:
    """The ``error`` object of Google's error body for ``e``."""
    return e.gemini_body()["error"]


async def generate_content(model: str, body: GenerateContentRequest, request: Request):
    return await _generate(model, body, request, stream=False)


async def stream_generate_content(model: str, body: GenerateContentRequest, request: Request):
    return await _generate(model, body, request, stream=True)


async def count_tokens(model: str, body: CountTokensRequest, request: Request) -> dict:
    state: ServerState = request.app.state.kit
    await state.resolve(model.removeprefix("models/"))
    if body.generate_content_request is not None:
        if body.contents:
            raise _bad("set contents or generateContentRequest, not both", "contents")
        inner = body.generate_content_request
        tools = _tools(inner, state.engine.capabilities()["tools"])[0]
    elif body.contents:
        inner, tools = GenerateContentRequest(contents=body.contents), None
    else:
        raise _bad("contents or generateContentRequest is required", "contents")
    req = ChatRequest(messages=_messages(inner), tools=tools)
    try:
        n = await state.count_tokens(req)
    except EngineError as e:
        raise _renamed(engine_error(e)) from None
    return {"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}


# Google serves the same methods under v1beta (Gemini CLI) and v1 (the SDKs' default).
for _version in ("v1beta", "v1"):
    for _method, _handler in (("generateContent", generate_content),
                              ("streamGenerateContent", stream_generate_content),
                              ("countTokens", count_tokens)):
        router.add_api_route(f"/{_version}/models/{{model:path}}:{_method}", _handler,
                             methods=["POST"])


async def not_served(rest: str) -> None:
    method = rest.rpartition(":")[2] if ":" in rest else rest
    raise APIError(404, f"{method!r} is not served by mlx-kit (generateContent, "
                   "streamGenerateContent and countTokens are)", type="not_found_error")


# Registered after the methods above: embedContent, batchEmbedContents... are 404s (the GET
# route below would otherwise answer them 405).
for _version in ("v1beta", "v1"):
    router.add_api_route(f"/{_version}/models/{{rest:path}}", not_served, methods=["POST"])


def _model_entry(entry: dict[str, Any]) -> dict[str, Any]:
    window = entry.get("context_window") or 0
    return {"name": f"models/{entry['id']}", "baseModelId": entry["id"], "version": "mlx-kit",
            "displayName": entry["id"], "description": "served by mlx-kit",
            "inputTokenLimit": window, "outputTokenLimit": window,
            "supportedGenerationMethods": ["generateContent", "streamGenerateContent",
                                           "countTokens"],
            "thinking": bool((entry.get("capabilities") or {}).get("reasoning"))}


@router.get("/v1beta/models")
async def list_models(request: Request) -> dict:
    state: ServerState = request.app.state.kit
    return {"models": [_model_entry(e) for e in state.model_entries()]}


@router.get("/v1beta/models/{model:path}")
async def get_model(model: str, request: Request) -> dict:
    state: ServerState = request.app.state.kit
    name = model.removeprefix("models/")
    await state.resolve(name)  # 404 for a name that is not served
    entries = state.model_entries()
    real = next((e for e in entries if e["id"] == name), entries[0])  # aliases: local's
    return {**_model_entry(real), "name": f"models/{name}",
            "baseModelId": name if real["id"] == name else STABLE_MODEL_ID}
