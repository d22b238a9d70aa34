"""Anthropic Messages: POST /v1/messages (streaming and not), POST
/v1/messages/count_tokens — what Claude Code speaks. A thin adapter over the engine's
events, like the OpenAI routers: no generation logic here.

Requests become the engine's chat messages: ``system`` (and system-role turns) -> one
leading system message;
``tool_result`` blocks -> ``tool`` messages; ``tool_use`` blocks -> assistant
``tool_calls``; ``thinking`` blocks -> the assistant turn's reasoning
(:func:`~kit.server.translate.history_reasoning`); redacted thinking and server-tool blocks
are dropped; image blocks are a 400 on a text-only model and images on a vision one (user
turns and ``tool_result`` content, :mod:`kit.server.content.media`); document blocks are a
400;
a block type Anthropic does not document is a 400 naming it (:mod:`kit.server.content`).
``thinking`` and ``output_config.effort`` become the chat template's reasoning variables
(:func:`thinking_options`); other unknown fields and beta features (``context_management``,
``?beta=true``) are accepted and ignored.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Literal

from fastapi import Request
from pydantic import Field, StrictInt

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
from kit.server.adapter import Renderer, begin, off_loop, protocol_router, respond
from kit.server.content import (
    AnthropicTool,
    AnthropicToolChoice,
    Block,
    DroppedBlock,
    Id,
    LenientModel,
    MAX_STOPS,
    MediaReader,
    MAX_TOKENS,
    MediaBlock,
    SystemBlock,
    Text,
    TextBlock,
    TokenCount,
    ToolResultBlock,
    ToolUseBlock,
    either,
    number,
)
from kit.server.errors import APIError
from kit.server.protocol import Protocol, under
from kit.server.state import ServerState
from kit.server.translate import (
    budget_effort,
    call_arguments,
    choose_tools,
    flatten,
    function_schema,
    history_call,
    history_reasoning,
    media_part,
    merge,
    message_content,
    output_cap,
    overridden,
    stop_strings,
    thinking_kwargs,
    with_media,
)

#: Anthropic's names for the engine's neutral fields are the neutral names themselves
#: (messages, tools, tool_choice, max_tokens, top_k); its error body has no param.
ANTHROPIC_FIELDS: dict[str, str] = {}

router = protocol_router(ANTHROPIC_FIELDS)

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                 "cancelled": "end_turn"}


class Message(LenientModel):
    # Claude Code also puts "system" messages among the turns (e.g. its agent list)
    role: Literal["user", "assistant", "system"]
    content: either(Text, list[Block])


class ThinkingConfig(LenientModel):
    """``thinking``: ``enabled`` with a budget (at least 1024 tokens, as Anthropic's API
    requires), ``disabled``, or ``adaptive`` (the model decides; Claude Code's default). A
    type this server does not know (a newer beta) is taken as ``adaptive``, as other beta
    fields are accepted and ignored."""

    type: Id
    budget_tokens: StrictInt | None = Field(default=None, ge=1024, le=MAX_TOKENS)


class OutputConfig(LenientModel):
    effort: Id | None = None


class MessagesRequest(LenientModel):
    """In the ranges Anthropic's API documents (temperature 0-1)."""

    model: Id
    messages: list[Message] = Field(min_length=1)
    max_tokens: TokenCount
    system: either(Text, list[SystemBlock]) | None = None
    stop_sequences: list[Text] | None = Field(default=None, max_length=MAX_STOPS)
    temperature: float | None = number(0, 1)
    top_p: float | None = number(0, 1, above=True)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class CountTokensRequest(LenientModel):
    model: Id
    messages: list[Message] = Field(min_length=1)
    system: either(Text, list[SystemBlock]) | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None


def _messages(body: MessagesRequest | CountTokensRequest,
              media: MediaReader | None = None) -> list[dict[str, Any]]:
    """The engine's chat messages for ``body.system`` and ``body.messages``; a vision
    model's ``image`` blocks (user turns, and ``tool_result`` content: a tool's screenshot)
    stay as images (:func:`message_content`).

    Raises:
        APIError: 400 for document and other non-text content, images on a text-only
            model, in an assistant turn or past a bound.
    """
    out: list[dict[str, Any]] = []
    # System text from `system` and from system-role turns goes first, as one message:
    # many chat templates accept a system message only at the start.
    system = [flatten(body.system, "system")] if body.system else []
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
        parts: list[Any] = []  # texts, and a vision model's images
        calls, results, thoughts = [], False, []
        for j, b in enumerate(m.content):
            if isinstance(b, ToolResultBlock):
                results = True
                out.append({"role": "tool", "tool_call_id": engine_call_id(b.tool_use_id),
                            "content": message_content(b.content, f"{where}.{j}.content",
                                                       media, "tool")})
            elif isinstance(b, ToolUseBlock):
                calls.append(history_call(engine_call_id(b.id), b.name, b.input))
            elif isinstance(b, TextBlock):
                parts.append(b.text)
            elif isinstance(b, MediaBlock):
                parts.append(media_part(b, f"{where}.{j}", media, m.role))
            elif b.type == "thinking" and isinstance((b.model_extra or {}).get("thinking"),
                                                     str):
                thoughts.append(b.model_extra["thinking"])
            # other DroppedBlocks (redacted thinking, server tools): not re-sent
        if parts or calls or m.role == "user" and not results:
            msg: dict[str, Any] = {"role": m.role, "content": merge(parts)}
            if calls:
                msg["tool_calls"] = calls
            if m.role == "assistant":
                history_reasoning(msg, "".join(thoughts))
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


def thinking_options(body: MessagesRequest) -> dict[str, Any]:
    """``thinking`` and ``output_config.effort`` as chat-template variables (see
    :func:`thinking_kwargs`): the effort when given, else the budget's
    (:func:`budget_effort`); ``disabled`` turns thinking off; ``adaptive`` alone leaves the
    template's default.

    Raises:
        InvalidRequest: an effort that is not one of ``EFFORTS`` (``output_config.effort``).
    """
    effort = body.output_config.effort if body.output_config else None
    field = "output_config.effort"
    t = body.thinking
    if t is None or t.type not in ("enabled", "disabled"):  # adaptive, or a newer type
        return thinking_kwargs(effort, field=field)
    if t.type == "disabled":
        return thinking_kwargs(effort, budget=0, field=field)
    return thinking_kwargs(effort or budget_effort(t.budget_tokens), budget=t.budget_tokens,
                           field=field)


def to_engine_request(body: MessagesRequest, defaults: SamplingParams,
                      supports_tools: bool = False,
                      context_window: int | None = None,
                      media: MediaReader | None = None) -> ChatRequest:
    """Translate a validated Messages request into the engine's :class:`ChatRequest`;
    ``defaults`` fills the sampling fields the request omits. ``max_tokens`` is a cap, as
    in Anthropic's API: one that reaches ``context_window`` (Claude Code sends 32000)
    becomes None, which the engine fits to what is left of the window. ``thinking`` and
    ``output_config.effort`` become template variables (:func:`thinking_options`).
    ``media``: the request's media reader (a vision model's images become
    ``ChatRequest.images``; None: refused). ``tool_choice.disable_parallel_tool_use``
    allows one call per turn (``auto``: at most one; ``any`` / ``tool``: exactly one).

    Raises:
        APIError: 400 for document and other non-text content, images that cannot be
            taken (see :func:`_messages`).
        InvalidRequest: ``tool_choice`` that cannot be honoured; an unknown effort.
    """
    params = overridden(defaults, temperature=body.temperature, top_p=body.top_p,
                        top_k=body.top_k)
    params = replace(params, max_tokens=output_cap(body.max_tokens, context_window),
                     stop=stop_strings(body.stop_sequences))
    tools, force = _tools(body, supports_tools)
    return ChatRequest(**with_media(_messages(body, media)), params=params, tools=tools,
                       force_tool=force, template_kwargs=thinking_options(body),
                       parallel_tool_calls=not getattr(body.tool_choice,
                                                       "disable_parallel_tool_use", None))


def _usage(fin: Finished | None) -> dict[str, int]:
    u = fin.usage if fin else None
    return {"input_tokens": u.prompt_tokens - u.cached_tokens if u else 0,
            "cache_read_input_tokens": u.cached_tokens if u else 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": u.completion_tokens if u else 0}


def _stop_reason(fin: Finished | None) -> str:
    if fin is not None and fin.stop_string:
        return "stop_sequence"
    return _STOP_REASONS.get(fin.finish_reason if fin else "stop", "end_turn")


def engine_call_id(tool_use_id: str) -> str:
    """A ``tool_use`` id in history as the chat template gets it: without the ``toolu_``
    that :func:`tool_use_block` put before the engine's id, so ids come back exactly as
    made (the ones the family's template checks too: Mistral's 9 alphanumerics, Kimi's
    ``functions.NAME:IDX``; and the next turn's cache, rendered with them, matches)."""
    return tool_use_id.removeprefix("toolu_")


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """A generated call as a ``tool_use`` block (id ``toolu_`` + the engine's id, which
    :func:`engine_call_id` gives back, input an object)."""
    return {"type": "tool_use", "id": "toolu_" + call.id,
            "name": call.name, "input": call_arguments(call)}


def _event(kind: str, data: dict) -> dict:
    return sse.event(kind, {"type": kind, **data})


class MessagesRenderer(Renderer):
    """The content blocks, their stream events (content_block_start/delta/stop) and the
    ``message`` body from the same engine events: text, thinking, tool_use."""

    def __init__(self, message: dict[str, Any], started: Started) -> None:
        self.message, self.started = message, started
        self.content: list[dict[str, Any]] = []
        self.open: str | None = None  # the kind of the block being streamed

    def opening(self) -> list:
        s = self.started
        return [_event("message_start", {"message": {**self.message, "usage": {
                    "input_tokens": s.prompt_tokens - s.cached_tokens,
                    "cache_read_input_tokens": s.cached_tokens,
                    "cache_creation_input_tokens": 0, "output_tokens": 0}}}),
                _event("ping", {})]

    def _open(self, kind: str, block: dict, empty: dict) -> list:
        """Start a new block (``empty``: how its start event shows it), closing the open one."""
        events = [_event("content_block_stop", {"index": len(self.content) - 1})] \
            if self.open is not None else []
        self.open = kind
        self.content.append(block)
        return events + [_event("content_block_start", {"index": len(self.content) - 1,
                                                        "content_block": empty})]

    def add(self, ev: Any) -> list:
        events: list = []
        if isinstance(ev, (TextDelta, ReasoningDelta)):
            kind, key, delta = ("text", "text", "text_delta") if isinstance(ev, TextDelta) \
                else ("thinking", "thinking", "thinking_delta")
            if self.open != kind:
                empty = {"type": "text", "text": ""} if kind == "text" else \
                    {"type": "thinking", "thinking": "", "signature": ""}
                events += self._open(kind, dict(empty), empty)
            self.content[-1][key] += ev.text
            events.append(_event("content_block_delta", {"index": len(self.content) - 1,
                                                         "delta": {"type": delta, key: ev.text}}))
        elif isinstance(ev, ToolCall):
            block = tool_use_block(ev)
            events += self._open("tool_use", block, {**block, "input": {}})
            events.append(_event("content_block_delta", {
                "index": len(self.content) - 1,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
        return events

    def finish(self, fin: Finished) -> list:
        stop = [_event("content_block_stop", {"index": len(self.content) - 1})] \
            if self.open is not None else []
        return stop + [_event("message_delta", {"delta": {"stop_reason": _stop_reason(fin),
                                                          "stop_sequence": fin.stop_string},
                                                "usage": _usage(fin)}),
                       _event("message_stop", {})]

    def error(self, e: APIError) -> list:
        return [sse.event("error", error_body(e))]

    def final(self, fin: Finished | None) -> dict:
        return {**self.message, "content": self.content or [{"type": "text", "text": ""}],
                "stop_reason": _stop_reason(fin),
                "stop_sequence": fin.stop_string if fin else None, "usage": _usage(fin)}


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request):
    req, started, events = await begin(request, body.model, body, to_engine_request, "msg_")
    message = {"id": req.request_id, "type": "message", "role": "assistant",
               "model": started.model, "content": [], "stop_reason": None,
               "stop_sequence": None}
    return await respond(request, events, MessagesRenderer(message, started),
                         stream=body.stream, fields=ANTHROPIC_FIELDS)


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict:
    state: ServerState = request.app.state.kit
    await state.resolve(body.model)
    media = state.media_reader()
    messages = await off_loop(media, _messages, body, media)
    req = ChatRequest(**with_media(messages),
                      tools=_tools(body, state.engine.capabilities()["tools"])[0])
    return {"input_tokens": await state.count_tokens(req)}


def error_body(e: APIError) -> dict:
    """Anthropic's error object (``{"type": "error", "error": {"type", "message"}}``)."""
    kind = {"invalid_request_error": "invalid_request_error",
            "authentication_error": "authentication_error",
            "permission_error": "permission_error", "not_found_error": "not_found_error",
            "rate_limit_error": "rate_limit_error"}.get(e.type, "api_error")
    if e.status == 507:
        kind = "overloaded_error"
    return {"type": "error", "error": {"type": kind, "message": e.message}}


PROTOCOL = Protocol("anthropic", router, under("/v1/messages"), error_body=error_body)
