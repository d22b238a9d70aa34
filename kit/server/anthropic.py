"""Anthropic Messages: POST /v1/messages (streaming and not), POST
/v1/messages/count_tokens — what Claude Code speaks. A thin adapter over the engine's
events, like the OpenAI routers: no generation logic here.

Requests become the engine's chat messages: ``system`` (and system-role turns) -> one
leading system message;
``tool_result`` blocks -> ``tool`` messages; ``tool_use`` blocks -> assistant
``tool_calls``; ``thinking`` and server-tool blocks in history are dropped (templates
re-render history without them); image and document blocks are a 400 (text-only models);
a block type Anthropic does not document is a 400 naming it (:mod:`kit.server.content`).
Unknown fields and beta features (``thinking``, ``context_management``,
``output_config``, ``?beta=true``) are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
import uuid
from typing import Any, Literal

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
from kit.server.content import (
    AnthropicTool,
    AnthropicToolChoice,
    Block,
    DroppedBlock,
    Id,
    MediaBlock,
    SystemBlock,
    Text,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    block_text,
    either,
    function_schema,
    refuse,
)
from kit.server.errors import APIError
from kit.server.openai_common import (
    MAX_STOPS,
    MAX_TOKENS,
    Open,
    number,
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
    content: either(Text, list[Block])


class MessagesRequest(Open):
    """In the ranges Anthropic's API documents (temperature 0-1)."""

    model: Id
    messages: list[Message] = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=MAX_TOKENS)
    system: either(Text, list[SystemBlock]) | None = None
    stop_sequences: list[Text] | None = Field(default=None, max_length=MAX_STOPS)
    temperature: float | None = number(0, 1)
    top_p: float | None = number(0, 1, above=True)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None


class CountTokensRequest(Open):
    model: Id
    messages: list[Message] = Field(min_length=1)
    system: either(Text, list[SystemBlock]) | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None


def _messages(body: MessagesRequest | CountTokensRequest) -> list[dict[str, Any]]:
    """The engine's chat messages for ``body.system`` and ``body.messages``.

    Raises:
        APIError: 400 for image, document and other non-text content.
    """
    out: list[dict[str, Any]] = []
    # System text from `system` and from system-role turns goes first, as one message:
    # many chat templates accept a system message only at the start.
    system = [block_text(body.system, "system")] if body.system else []
    system += [_turn_text(m.content, f"messages.{i}.content")
               for i, m in enumerate(body.messages) if m.role == "system"]
    if system:
        out.append({"role": "system", "content": "\n\n".join(system)})
    for i, m in enumerate(body.messages):
        where = f"messages.{i}.content"
        if m.role == "system":
            continue
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts, calls, results = [], [], False
        for j, b in enumerate(m.content):
            if isinstance(b, ToolResultBlock):
                results = True
                out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                            "content": block_text(b.content, f"{where}.{j}.content")})
            elif isinstance(b, ToolUseBlock):
                calls.append({"id": b.id, "type": "function", "function": {
                    "name": b.name, "arguments": b.input}})
            elif isinstance(b, TextBlock):
                texts.append(b.text)
            elif isinstance(b, MediaBlock):
                raise refuse(b.type, f"{where}.{j}")
            # DroppedBlock (thinking, server tools): not re-sent to the model
        if texts or calls or m.role == "user" and not results:
            msg: dict[str, Any] = {"role": m.role, "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _turn_text(content: str | list, where: str) -> str:
    """The text of a system-role turn (text blocks only)."""
    if isinstance(content, str):
        return content
    for j, b in enumerate(content):
        if not isinstance(b, (TextBlock, DroppedBlock)):
            raise APIError(400, f"a system turn holds text only, not {b.type}",
                           param=f"{where}.{j}", code="invalid_value")
    return "".join(b.text for b in content if isinstance(b, TextBlock))


def _tools(body: MessagesRequest | CountTokensRequest,
           supports_tools: bool) -> tuple[list | None, str | None]:
    """Anthropic tools as function schemas and the call to force, after ``tool_choice``
    (auto / any / tool / none; see :func:`choose_tools`)."""
    tools = [function_schema(t.name, t.description, t.input_schema) for t in body.tools or []]
    choice = body.tool_choice
    kind = {"any": "required", "tool": "named"}.get(choice.type, choice.type) if choice \
        else "auto"
    return choose_tools(tools, kind, getattr(choice, "name", None), supports_tools)


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
        n = await state.count_tokens(req)
    except EngineError as e:
        raise engine_error(e) from None
    return {"input_tokens": n}


