"""POST /v1/chat/completions (OpenAI Chat Completions), streaming (SSE) and not."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field
from sse_starlette.sse import EventSourceResponse

from kit.engine.types import (
    ChatRequest,
    Finished,
    ReasoningDelta,
    SamplingParams,
    TextDelta,
    ToolCall,
)
from kit.server.content import (
    ChatPart,
    ChatResponseFormat,
    ChatTool,
    ChatToolCall,
    ChatToolChoice,
    Id,
    TemplateKwargs,
    Text,
    chat_text,
    either,
    function_schema,
    tool_arguments,
)
from kit.server.errors import APIError
from kit.server.openai_common import (
    MAX_TOKENS,
    Open,
    SamplingFields,
    choose_tools,
    response_schema,
    collect,
    sampling,
    start,
    stream_events,
    usage,
)
from kit.server.state import ServerState

router = APIRouter()


class ChatMessage(Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: either(Text, list[ChatPart]) | None = None
    name: Id | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: Id | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ChatResponseFormat | None = None
    tools: list[ChatTool] | None = None
    tool_choice: either(Literal["auto", "none", "required"], ChatToolChoice) | None = None
    reasoning_effort: Id | None = None
    chat_template_kwargs: TemplateKwargs | None = None


def _flatten(message: ChatMessage, index: int) -> dict[str, Any]:
    """One message for the chat template: content as a string, ``developer`` as ``system``,
    tool-call arguments as mappings (what templates expect)."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                           "content": chat_text(message.content, f"messages.{index}.content")}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name,
                "arguments": tool_arguments(call.function.arguments)}}
            for call in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


def _tools(body: ChatCompletionRequest,
           supports_tools: bool) -> tuple[list[dict] | None, str | None]:
    """The tools and the call to force after ``tool_choice`` (see :func:`choose_tools`)."""
    tools = [function_schema(t.function.name, t.function.description, t.function.parameters)
             for t in body.tools or []]
    choice = body.tool_choice
    if isinstance(choice, ChatToolChoice):
        return choose_tools(tools, "named", choice.function.name, supports_tools)
    return choose_tools(tools, choice or "auto", None, supports_tools)


def to_engine_request(body: ChatCompletionRequest, defaults: SamplingParams,
                      supports_tools: bool = False) -> ChatRequest:
    """Translate a validated Chat Completions request into the engine's
    :class:`ChatRequest`; ``defaults`` fills temperature and top_p when the request omits
    them (an omitted max_tokens stays None: the engine fits it to the model and context
    window).

    Raises:
        APIError: 400 for what this server cannot honour (n > 1, image/audio/file content,
            a json_schema without a schema, a forced tool call on a model without tool
            support).
    """
    schema = response_schema(body.response_format, "response_format")
    params = sampling(body, defaults, max_tokens=body.max_completion_tokens or body.max_tokens,
                      logprobs=bool(body.logprobs), top_logprobs=body.top_logprobs or 0)
    template_kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort is not None:
        template_kwargs.setdefault("reasoning_effort", body.reasoning_effort)
        template_kwargs.setdefault("enable_thinking", body.reasoning_effort not in ("none",
                                                                                   "minimal"))
    messages = [_flatten(m, i) for i, m in enumerate(body.messages)]
    tools, force = _tools(body, supports_tools)
    return ChatRequest(messages=messages, params=params, tools=tools, force_tool=force,
                       response_schema=schema, template_kwargs=template_kwargs)


def _logprobs(entries) -> list[dict[str, Any]]:
    def one(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
            for e in entries]


def _tool_call(call: ToolCall, streaming: bool) -> dict[str, Any]:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}}
    return {"index": call.index, **out} if streaming else out


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state: ServerState = request.app.state.kit
    model = await state.resolve(body.model)
    req = to_engine_request(body, state.sampling_defaults(),
                            supports_tools=state.engine.capabilities()["tools"])
    req.model = model
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    req.request_id = completion_id
    created = int(time.time())
    started, events = await start(state, req)
    # Like OpenAI, "model" names the model that actually answered (the real id).
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
            "model": started.model, "system_fingerprint": "mlx-kit"}

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk(delta: dict, finish: str | None = None, logprobs: Any = None) -> dict:
            return {"data": json.dumps({**base, "choices": [
                {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})}

        async def sse():
            yield chunk({"role": "assistant", "content": ""})
            async for ev in stream_events(events):
                if isinstance(ev, TextDelta):
                    yield chunk({"content": ev.text}, logprobs={
                        "content": _logprobs(ev.logprobs)} if ev.logprobs else None)
                elif isinstance(ev, ReasoningDelta):
                    yield chunk({"reasoning_content": ev.text})
                elif isinstance(ev, ToolCall):
                    yield chunk({"tool_calls": [_tool_call(ev, streaming=True)]})
                elif isinstance(ev, Finished):
                    yield chunk({}, ev.finish_reason)
                    if include_usage:
                        yield {"data": json.dumps({**base, "choices": [], "usage": usage(ev)})}
                elif isinstance(ev, APIError):  # after the headers: an error in the stream
                    yield {"data": json.dumps(ev.body())}
            yield {"data": "[DONE]"}

        return EventSourceResponse(sse(), ping=15)

    got, fin = await collect(request, events)
    text = "".join(e.text for e in got if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in got if isinstance(e, ReasoningDelta))
    calls = [_tool_call(e, streaming=False) for e in got if isinstance(e, ToolCall)]
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    logprobs = [lp for e in got if isinstance(e, TextDelta) for lp in e.logprobs]
    return {**base, "object": "chat.completion", "choices": [
        {"index": 0, "message": message,
         "logprobs": {"content": _logprobs(logprobs)} if body.logprobs else None,
         "finish_reason": fin.finish_reason if fin else "stop"}],
        "usage": usage(fin)}
