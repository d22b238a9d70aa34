"""POST /v1/chat/completions (OpenAI Chat Completions), streaming (SSE) and not: the
request models, one translation into the engine's ChatRequest and one renderer."""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import Request
from pydantic import Field

from kit.engine.types import (
    ChatRequest,
    Finished,
    ReasoningDelta,
    SamplingParams,
    Started,
    TextDelta,
    ToolCall,
)
from kit.server import sse
from kit.server.adapter import begin, protocol_router, respond
from kit.server.content import (
    ChatPart,
    ChatResponseFormat,
    ChatTool,
    ChatToolCall,
    ChatToolChoice,
    Id,
    LenientModel,
    MediaReader,
    TemplateKwargs,
    Text,
    TokenCount,
    either,
)
from kit.server.openai_common import (
    ChunkStream,
    OPENAI_FIELDS,
    SamplingFields,
    finish_reason,
    response_schema,
    sampling,
    usage,
)
from kit.server.protocol import Protocol, under
from kit.server.translate import (
    choose_tools,
    function_schema,
    history_call,
    history_reasoning,
    message_content,
    thinking_kwargs,
    tool_arguments,
    with_media,
)

router = protocol_router(OPENAI_FIELDS)


class ChatMessage(LenientModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: either(Text, list[ChatPart]) | None = None
    name: Id | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: Id | None = None
    # an assistant turn's reasoning as clients send it back (ours: reasoning_content)
    reasoning_content: Text | None = None
    reasoning: Text | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ChatResponseFormat | None = None
    tools: list[ChatTool] | None = None
    tool_choice: either(Literal["auto", "none", "required"], ChatToolChoice) | None = None
    # absent or true: one or more calls per turn; false: at most one (ChatRequest's field)
    parallel_tool_calls: bool | None = None
    reasoning_effort: Id | None = None
    chat_template_kwargs: TemplateKwargs | None = None


def _message(message: ChatMessage, index: int, media: MediaReader | None) -> dict[str, Any]:
    """One message for the chat template: content as a string (a vision model's user and
    tool messages with images: the multimodal list, :func:`message_content`),
    ``developer`` as ``system``, tool-call arguments as mappings (what templates expect),
    an assistant turn's ``reasoning_content`` (or ``reasoning``) where templates read it
    (:func:`history_reasoning`)."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": message_content(
        message.content, f"messages.{index}.content", media, role)}
    if message.tool_calls:
        out["tool_calls"] = [history_call(call.id, call.function.name,
                                          tool_arguments(call.function.arguments))
                             for call in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    if message.role == "assistant":
        history_reasoning(out, message.reasoning_content or message.reasoning)
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
                      supports_tools: bool = False,
                      context_window: int | None = None,
                      media: MediaReader | None = None) -> ChatRequest:
    """Translate a validated Chat Completions request into the engine's
    :class:`ChatRequest`; ``defaults`` fills temperature, top_p, top_k and min_p when the
    request omits them (an omitted max_tokens stays None: the engine fits it to the model
    and context window, so ``context_window`` is not needed here). ``media``: the
    request's media reader; with a vision model, ``image_url`` parts of user and tool
    messages become ``ChatRequest.images`` (None: every media part is refused).

    ``reasoning_effort`` becomes the template variables ``reasoning_effort`` and
    ``enable_thinking`` unless ``chat_template_kwargs`` sets them itself;
    ``parallel_tool_calls: false`` allows one call per turn (absent or true: several).

    Raises:
        APIError: 400 for what this server cannot honour (n > 1, audio/file content, image
            content on a text-only model or past a bound, a json_schema without a schema).
        InvalidRequest: ``tool_choice`` that cannot be honoured (e.g. a forced call on a
            model without tool support); a ``reasoning_effort`` not in ``EFFORTS``.
    """
    schema = response_schema(body.response_format, "response_format")
    params = sampling(body, defaults, max_tokens=body.max_completion_tokens or body.max_tokens,
                      logprobs=bool(body.logprobs), top_logprobs=body.top_logprobs or 0)
    template_kwargs = dict(body.chat_template_kwargs or {})
    for key, value in thinking_kwargs(body.reasoning_effort).items():
        template_kwargs.setdefault(key, value)
    messages = [_message(m, i, media) for i, m in enumerate(body.messages)]
    tools, force = _tools(body, supports_tools)
    return ChatRequest(**with_media(messages), params=params, tools=tools,
                       force_tool=force, response_schema=schema,
                       parallel_tool_calls=body.parallel_tool_calls is not False,
                       template_kwargs=template_kwargs)


def _logprobs(entries) -> list[dict[str, Any]]:
    def one(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
            for e in entries]


def _tool_call(call: ToolCall, streaming: bool) -> dict[str, Any]:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}}
    return {"index": call.index, **out} if streaming else out


class ChatRenderer(ChunkStream):
    """``chat.completion.chunk`` frames and the ``chat.completion`` body from the same
    events: text, reasoning (``reasoning_content``), tool calls, logprobs."""

    def __init__(self, base: dict[str, Any], *, include_usage: bool, logprobs: bool) -> None:
        super().__init__(base, include_usage)
        self.want_logprobs = logprobs
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self.logprobs: list = []

    def _chunk(self, delta: dict, finish: str | None = None, logprobs: Any = None) -> dict:
        return sse.data({**self.base, "choices": [
            {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})

    def opening(self) -> list:
        return [self._chunk({"role": "assistant", "content": ""})]

    def add(self, ev: Any) -> list:
        if isinstance(ev, TextDelta):
            self.text.append(ev.text)
            self.logprobs += ev.logprobs
            return [self._chunk({"content": ev.text}, logprobs={
                "content": _logprobs(ev.logprobs)} if ev.logprobs else None)]
        if isinstance(ev, ReasoningDelta):
            self.reasoning.append(ev.text)
            return [self._chunk({"reasoning_content": ev.text})]
        if isinstance(ev, ToolCall):
            self.calls.append(ev)
            return [self._chunk({"tool_calls": [_tool_call(ev, streaming=True)]})]
        return []

    def last_chunk(self, fin: Finished) -> dict:
        return self._chunk({}, fin.finish_reason)

    def final(self, fin: Finished | None) -> dict:
        text, calls = "".join(self.text), [_tool_call(c, streaming=False) for c in self.calls]
        message: dict[str, Any] = {"role": "assistant",
                                   "content": text or (None if calls else "")}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if calls:
            message["tool_calls"] = calls
        return {**self.base, "object": "chat.completion", "choices": [
            {"index": 0, "message": message,
             "logprobs": {"content": _logprobs(self.logprobs)} if self.want_logprobs
             else None, "finish_reason": finish_reason(fin)}], "usage": usage(fin)}


def _base(req: ChatRequest, started: Started) -> dict[str, Any]:
    # Like OpenAI, "model" names the model that actually answered (the real id).
    return {"id": req.request_id, "object": "chat.completion.chunk",
            "created": int(time.time()), "model": started.model,
            "system_fingerprint": "mlx-kit"}


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    req, started, events = await begin(request, body.model, body, to_engine_request,
                                       "chatcmpl-")
    renderer = ChatRenderer(_base(req, started), logprobs=bool(body.logprobs),
                            include_usage=bool(body.stream_options
                                               and body.stream_options.include_usage))
    return await respond(request, events, renderer, stream=body.stream, fields=OPENAI_FIELDS)


PROTOCOL = Protocol("openai-chat", router, under("/v1/chat/completions"))
