"""Anthropic Messages: POST /v1/messages (streaming and not), POST
/v1/messages/count_tokens — what Claude Code speaks. A thin adapter over the engine's
events, like the OpenAI routers: no generation logic here.

Requests become the engine's chat messages: ``system`` (and system-role turns) -> one
leading system message;
``tool_result`` blocks -> ``tool`` messages; ``tool_use`` blocks -> assistant
``tool_calls``; ``thinking`` blocks in history are dropped (templates re-render history
without them). Unknown fields and beta features (``thinking``, ``context_management``,
``output_config``, ``?beta=true``) are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
import uuid
from typing import Any, Literal, Union

from fastapi import APIRouter, Request
from pydantic import Field
from sse_starlette.sse import EventSourceResponse

from kit.engine.types import (
    ChatRequest,
    EngineError,
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCall,
)
from kit.server.errors import APIError
from kit.server.openai_common import (
    Open,
    choose_tools,
    collect,
    engine_error,
    start,
    stream_events,
)
from kit.server.state import ServerState

router = APIRouter()

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                 "cancelled": "end_turn"}


class Message(Open):
    # Claude Code also puts "system" messages among the turns (e.g. its agent list)
    role: Literal["user", "assistant", "system"]
    content: Union[str, list[dict[str, Any]]]


class Tool(Open):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class MessagesRequest(Open):
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: Union[str, list[dict[str, Any]], None] = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None


class CountTokensRequest(Open):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    tools: list[Tool] | None = None


def _text(blocks: Any, where: str) -> str:
    """The text of a string or a list of blocks; images are refused (text-only models)."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for b in blocks or []:
        kind = b.get("type")
        if kind == "text":
            parts.append(str(b.get("text", "")))
        elif kind in ("image", "document"):
            raise APIError(400, f"{kind} content is not supported by this text-only model",
                           param=where)
        elif kind == "tool_result":  # nested in tool results: flattened the same way
            parts.append(_text(b.get("content"), where))
    return "".join(parts)


def _messages(body: MessagesRequest | CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # System text from `system` and from system-role turns goes first, as one message:
    # many chat templates accept a system message only at the start.
    system = [_text(body.system, "system")] if body.system else []
    system += [_text(m.content, f"messages.{i}.content") for i, m in enumerate(body.messages)
               if m.role == "system"]
    if system:
        out.append({"role": "system", "content": "\n\n".join(system)})
    for i, m in enumerate(body.messages):
        where = f"messages.{i}.content"
        if m.role == "system":
            continue
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts, calls = [], []
        for b in m.content:
            kind = b.get("type")
            if kind == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""),
                            "content": _text(b.get("content"), where)})
            elif kind == "tool_use":
                calls.append({"id": b.get("id", ""), "type": "function", "function": {
                    "name": b.get("name", ""), "arguments": b.get("input") or {}}})
            elif kind == "text":
                texts.append(str(b.get("text", "")))
            elif kind in ("image", "document"):
                _text([b], where)  # raises the 400
            # thinking / redacted_thinking / server tool blocks: not re-sent to the model
        if texts or calls or m.role == "user" and not any(
                b.get("type") == "tool_result" for b in m.content):
            msg: dict[str, Any] = {"role": m.role, "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tools(body: MessagesRequest | CountTokensRequest,
           supports_tools: bool) -> tuple[list | None, str | None]:
    """Anthropic tools as function schemas and the call to force, after ``tool_choice``
    (auto / any / tool / none; see :func:`choose_tools`)."""
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description
                                               or "", "parameters": t.input_schema}}
             for t in body.tools or []]
    choice = getattr(body, "tool_choice", None) or {"type": "auto"}
    kind = {"any": "required", "tool": "named"}.get(choice.get("type", "auto"),
                                                    choice.get("type", "auto"))
    return choose_tools(tools, kind, choice.get("name"), supports_tools)


def _usage(fin: Finished | None) -> dict[str, int]:
    u = fin.usage if fin else None
    return {"input_tokens": u.prompt_tokens - u.cached_tokens if u else 0,
            "cache_read_input_tokens": u.cached_tokens if u else 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": u.completion_tokens if u else 0}


def _tool_block(call: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = {"_raw": call.arguments}
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"),
            "name": call.name, "input": args}


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request):
    state: ServerState = request.app.state.kit
    model = await state.resolve(body.model)
    params = replace(
        state.sampling_defaults(),
        # a cap, as in Anthropic's API: clients send large values (Claude Code: 32000);
        # the engine fits it to what is left of the context window
        max_tokens=None if body.max_tokens >= state.engine.model_info.context_window
        else body.max_tokens,
        stop=tuple(s for s in body.stop_sequences or () if s),
        **{k: v for k, v in (("temperature", body.temperature), ("top_p", body.top_p),
                             ("top_k", body.top_k)) if v is not None})
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    tools, force = _tools(body, state.engine.capabilities()["tools"])
    req = ChatRequest(messages=_messages(body), params=params, model=model, request_id=msg_id,
                      tools=tools, force_tool=force)
    started, events = await start(state, req)
    message = {"id": msg_id, "type": "message", "role": "assistant", "model": started.model,
               "content": [], "stop_reason": None, "stop_sequence": None}

    if body.stream:
        def event(kind: str, data: dict) -> dict:
            return {"event": kind, "data": json.dumps({"type": kind, **data})}

        async def sse():
            yield event("message_start", {"message": {**message, "usage": {
                "input_tokens": started.prompt_tokens - started.cached_tokens,
                "cache_read_input_tokens": started.cached_tokens,
                "cache_creation_input_tokens": 0, "output_tokens": 0}}})
            yield event("ping", {})
            index, open_kind = -1, None

            def open_block(kind: str, block: dict):
                nonlocal index, open_kind
                events_ = []
                if open_kind is not None:
                    events_.append(event("content_block_stop", {"index": index}))
                index += 1
                open_kind = kind
                events_.append(event("content_block_start", {"index": index,
                                                             "content_block": block}))
                return events_

            async for ev in stream_events(events):
                if isinstance(ev, TextDelta):
                    if open_kind != "text":
                        for e in open_block("text", {"type": "text", "text": ""}):
                            yield e
                    yield event("content_block_delta", {"index": index, "delta": {
                        "type": "text_delta", "text": ev.text}})
                elif isinstance(ev, ReasoningDelta):
                    if open_kind != "thinking":
                        for e in open_block("thinking", {"type": "thinking", "thinking": "",
                                                         "signature": ""}):
                            yield e
                    yield event("content_block_delta", {"index": index, "delta": {
                        "type": "thinking_delta", "thinking": ev.text}})
                elif isinstance(ev, ToolCall):
                    block = _tool_block(ev)
                    for e in open_block("tool_use", {**block, "input": {}}):
                        yield e
                    yield event("content_block_delta", {"index": index, "delta": {
                        "type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
                elif isinstance(ev, Finished):
                    if open_kind is not None:
                        yield event("content_block_stop", {"index": index})
                    reason = "stop_sequence" if ev.stop_string else \
                        _STOP_REASONS.get(ev.finish_reason, "end_turn")
                    yield event("message_delta", {"delta": {"stop_reason": reason,
                                                            "stop_sequence": ev.stop_string},
                                                  "usage": _usage(ev)})
                    yield event("message_stop", {})
                elif isinstance(ev, APIError):
                    yield {"event": "error", "data": json.dumps(ev.anthropic_body())}

        return EventSourceResponse(sse(), ping=15)

    got, fin = await collect(request, events)
    content: list[dict[str, Any]] = []
    for ev in got:
        kind = {TextDelta: "text", ReasoningDelta: "thinking"}.get(type(ev))
        if isinstance(ev, ToolCall):
            content.append(_tool_block(ev))
        elif content and content[-1]["type"] == kind:
            content[-1][kind] += ev.text
        elif kind == "text":
            content.append({"type": "text", "text": ev.text})
        elif kind == "thinking":
            content.append({"type": "thinking", "thinking": ev.text, "signature": ""})
    if not content:
        content = [{"type": "text", "text": ""}]
    reason = "stop_sequence" if fin and fin.stop_string else \
        _STOP_REASONS.get(fin.finish_reason if fin else "stop", "end_turn")
    return {**message, "content": content, "stop_reason": reason,
            "stop_sequence": fin.stop_string if fin else None, "usage": _usage(fin)}


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict:
    state: ServerState = request.app.state.kit
    await state.resolve(body.model)
    req = ChatRequest(messages=_messages(body),
                      tools=_tools(body, state.engine.capabilities()["tools"])[0])
    try:
        n = await asyncio.to_thread(state.engine.count_tokens, req)
    except EngineError as e:
        raise engine_error(e) from None
    return {"input_tokens": n}


