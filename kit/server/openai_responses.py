"""OpenAI Responses: POST /v1/responses (streaming and not) — what Codex speaks
(``wire_api = "responses"``). A thin adapter over the engine's events.

Input items become the engine's chat messages: ``instructions`` and system/developer
messages -> system; ``function_call`` items -> assistant ``tool_calls``;
``function_call_output`` -> ``tool`` messages; a ``reasoning`` item's text -> the
reasoning of the assistant turn after it (:func:`~kit.server.translate.history_reasoning`);
hosted-tool items are dropped. Nothing is stored (``store`` is accepted; ``previous_response_id`` and
``item_reference`` items are refused with 400). Codex's ``include``, ``reasoning``,
``prompt_cache_key`` are accepted; ``parallel_tool_calls: false`` allows one call per turn
(absent or true: several), and the response echoes it. Items, content parts and roles
are typed (:mod:`kit.server.content`): an unknown one is a 400 naming it.
"""

from __future__ import annotations

import time
from dataclasses import replace
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
from kit.server.adapter import Renderer, begin, protocol_router, respond
from kit.server.content import (
    FunctionCallItem,
    FunctionCallOutputItem,
    HistoryItem,
    Id,
    InputItem,
    ItemReference,
    LenientModel,
    MediaReader,
    MessageItem,
    ReasoningConfig,
    ResponsesFunctionTool,
    ResponsesTool,
    ResponsesToolChoice,
    Text,
    TextConfig,
    TokenCount,
    either,
    number,
)
from kit.server.errors import APIError
from kit.server.openai_common import response_schema
from kit.server.protocol import Protocol, under
from kit.server.translate import (
    choose_tools,
    function_schema,
    history_call,
    history_reasoning,
    message_content,
    new_id,
    overridden,
    reasoning_text,
    thinking_kwargs,
    tool_arguments,
    with_media,
)

#: The Responses API's names for the engine's neutral field names.
RESPONSES_FIELDS = {"schema": "text.format", "messages": "input",
                    "max_tokens": "max_output_tokens", "template_kwargs": "reasoning"}

router = protocol_router(RESPONSES_FIELDS)


class ResponsesRequest(LenientModel):
    model: Id
    input: either(Text, list[InputItem])
    instructions: Text | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: either(Literal["auto", "none", "required"], ResponsesToolChoice) | None = None
    parallel_tool_calls: bool | None = None  # absent: true, as OpenAI's default
    max_output_tokens: TokenCount | None = None
    temperature: float | None = number(0, 2)
    top_p: float | None = number(0, 1, above=True)
    stream: bool = False
    previous_response_id: Id | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None


def _messages(body: ResponsesRequest,
              media: MediaReader | None = None) -> list[dict[str, Any]]:
    """The engine's chat messages for ``body.instructions`` and ``body.input``; a vision
    model's ``input_image`` parts (user messages, ``function_call_output`` lists) stay as
    images (:func:`message_content`).

    Raises:
        APIError: 400 for file/audio content, images on a text-only model or past a bound,
            and item references.
    """
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return out + [{"role": "user", "content": body.input}]
    reasoning = ""  # a reasoning item's text, for the assistant turn that follows it
    for i, item in enumerate(body.input):
        where = f"input.{i}"
        if isinstance(item, MessageItem):
            role = "system" if item.role in ("system", "developer") else item.role
            out.append({"role": role, "content": message_content(
                item.content, f"{where}.content", media, role)})
            if role == "assistant":
                history_reasoning(out[-1], reasoning)
            reasoning = ""
        elif isinstance(item, FunctionCallItem):
            call = history_call(item.call_id, item.name, tool_arguments(item.arguments))
            if out and out[-1]["role"] == "assistant" and not out[-1]["content"]:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            if reasoning:
                history_reasoning(out[-1], out[-1].get("reasoning_content", "") + reasoning)
            reasoning = ""
        elif isinstance(item, HistoryItem) and item.type == "reasoning":
            reasoning += reasoning_text((item.model_extra or {}).get("content"))
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id,
                        "content": message_content(item.output, f"{where}.output", media,
                                                   "tool")})
        elif isinstance(item, ItemReference):
            raise APIError(400, "item_reference is not supported: this server stores no "
                           "items; send the item itself", param=where,
                           code="unsupported_value")
        # other HistoryItems (hosted tool calls): not re-sent to the model
    return out


def _tools(body: ResponsesRequest,
           supports_tools: bool) -> tuple[list[dict] | None, str | None]:
    """Responses function tools as chat-template schemas and the call to force, after
    ``tool_choice`` (see :func:`choose_tools`); hosted tools are not offered."""
    tools = [function_schema(t.name, t.description, t.parameters)
             for t in body.tools or [] if isinstance(t, ResponsesFunctionTool)]
    choice = body.tool_choice
    if isinstance(choice, ResponsesToolChoice):
        if choice.type != "function":
            raise APIError(400, "tool_choice: only function tools can be forced here",
                           param="tool_choice.type", code="unsupported_value")
        return choose_tools(tools, "named", choice.name, supports_tools)
    return choose_tools(tools, choice or "auto", None, supports_tools)


def to_engine_request(body: ResponsesRequest, defaults: SamplingParams,
                      supports_tools: bool = False,
                      context_window: int | None = None,
                      media: MediaReader | None = None) -> ChatRequest:
    """Translate a validated Responses request into the engine's :class:`ChatRequest`:
    ``defaults`` fills the sampling fields the request omits, ``reasoning.effort`` becomes
    the template variables ``reasoning_effort`` / ``enable_thinking``, ``text.format`` the
    answer's schema (``context_window`` is not needed here); ``media``: the request's
    media reader (a vision model's images become ``ChatRequest.images``; None: refused).

    Raises:
        APIError: 400 for ``previous_response_id``, item references, media content, a
            json_schema without a schema, a forced hosted tool.
        InvalidRequest: ``tool_choice`` that cannot be honoured.
    """
    if body.previous_response_id:
        raise APIError(400, "previous_response_id is not supported: this server stores no "
                       "responses; send the whole input", param="previous_response_id",
                       code="unsupported_value")
    schema = response_schema(body.text.format if body.text else None, "text.format")
    params = replace(overridden(defaults, temperature=body.temperature, top_p=body.top_p),
                     max_tokens=body.max_output_tokens)
    effort = body.reasoning.effort if body.reasoning else None
    tools, force = _tools(body, supports_tools)
    return ChatRequest(**with_media(_messages(body, media)), params=params, tools=tools,
                       force_tool=force, response_schema=schema,
                       parallel_tool_calls=body.parallel_tool_calls is not False,
                       template_kwargs=thinking_kwargs(effort or None,
                                                       field="reasoning.effort"))


class ResponsesRenderer(Renderer):
    """The output items, their stream events (numbered by ``sequence_number``) and the
    ``response`` object, from the same engine events.

    Args:
        base: the response object's fixed fields (id, model, the request's echoed
            settings); None for a bare item builder (tests).
    """

    def __init__(self, base: dict[str, Any] | None = None) -> None:
        self.base = base or {}
        self.output: list[dict[str, Any]] = []
        self.seq = 0

    def event(self, kind: str, **data: Any) -> dict:
        self.seq += 1
        return sse.event(kind, {"type": kind, "sequence_number": self.seq, **data})

    def _current(self, kind: str) -> dict | None:
        last = self.output[-1] if self.output else None
        return last if last and last["type"] == kind and last["status"] == "in_progress" else None

    def close(self, status: str = "completed") -> list[dict]:
        """Finish the open item with ``status`` (``"incomplete"``: max_output_tokens cut
        it, as OpenAI marks such an item); returns its done events."""
        last = self.output[-1] if self.output else None
        if not last or last["status"] != "in_progress":
            return []
        last["status"] = status
        i = len(self.output) - 1
        if last["type"] == "message":
            part = last["content"][0]
            return [self.event("response.output_text.done", item_id=last["id"], output_index=i,
                               content_index=0, text=part["text"]),
                    self.event("response.content_part.done", item_id=last["id"],
                               output_index=i, content_index=0, part=part),
                    self.event("response.output_item.done", output_index=i, item=last)]
        if last["type"] == "reasoning":
            text = last["content"][0]["text"]
            return [self.event("response.reasoning_text.done", item_id=last["id"],
                               output_index=i, content_index=0, text=text),
                    self.event("response.output_item.done", output_index=i, item=last)]
        return [self.event("response.output_item.done", output_index=i, item=last)]

    def _start(self, item: dict[str, Any], **shown: Any) -> list[dict]:
        """Close the open item and add ``item``; ``shown``: how the added event shows it."""
        events = self.close()
        self.output.append(item)
        return events + [self.event("response.output_item.added",
                                    output_index=len(self.output) - 1, item={**item, **shown})]

    def add(self, ev: Any) -> list[dict]:
        """Apply one engine event; returns the stream events it makes."""
        events: list[dict] = []
        i = len(self.output) - 1
        if isinstance(ev, TextDelta):
            item = self._current("message")
            if item is None:
                part = {"type": "output_text", "text": "", "annotations": []}
                item = {"type": "message", "id": new_id("msg_"), "status": "in_progress",
                        "role": "assistant", "content": [dict(part)]}
                events += self._start(item, content=[])
                i = len(self.output) - 1
                events.append(self.event("response.content_part.added", item_id=item["id"],
                                         output_index=i, content_index=0, part=part))
            item["content"][0]["text"] += ev.text
            events.append(self.event("response.output_text.delta", item_id=item["id"],
                                     output_index=i, content_index=0, delta=ev.text))
        elif isinstance(ev, ReasoningDelta):
            item = self._current("reasoning")
            if item is None:
                item = {"type": "reasoning", "id": new_id("rs_"), "status": "in_progress",
                        "summary": [], "content": [{"type": "reasoning_text", "text": ""}]}
                events += self._start(item)
                i = len(self.output) - 1
            item["content"][0]["text"] += ev.text
            events.append(self.event("response.reasoning_text.delta", item_id=item["id"],
                                     output_index=i, content_index=0, delta=ev.text))
        elif isinstance(ev, ToolCall):
            item = {"type": "function_call", "id": new_id("fc_"), "call_id": ev.id,
                    "name": ev.name, "arguments": ev.arguments, "status": "in_progress"}
            events += self._start(item, arguments="")
            i = len(self.output) - 1
            events += [self.event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=i, delta=ev.arguments),
                       self.event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=i, arguments=ev.arguments),
                       *self.close()]
        return events

    def opening(self) -> list:
        pending = {**self.base, "status": "in_progress", "output": [], "usage": None}
        return [self.event("response.created", response=pending),
                self.event("response.in_progress", response=pending)]

    def finish(self, fin: Finished) -> list:
        # OpenAI ends a stream cut by max_output_tokens with response.incomplete, not
        # response.completed; the response object is the same one the body would be.
        events = self.close(_status(fin))  # before final(), which would close it silently
        response = self.final(fin)
        kind = "response.incomplete" if response["status"] == "incomplete" \
            else "response.completed"
        return [*events, self.event(kind, response=response)]

    def error(self, e: APIError) -> list:
        return [self.event("response.failed", response={
            **self.base, "status": "failed", "output": self.output,
            "error": {"code": e.code or "server_error", "message": e.message}})]

    def final(self, fin: Finished | None) -> dict:
        self.close(_status(fin))
        u = fin.usage if fin else None
        incomplete = _status(fin) == "incomplete"
        return {**self.base, "status": _status(fin),
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "output": self.output, "usage": {
                    "input_tokens": u.prompt_tokens if u else 0,
                    "input_tokens_details": {"cached_tokens": u.cached_tokens if u else 0},
                    "output_tokens": u.completion_tokens if u else 0,
                    "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens if u else 0},
                    "total_tokens": u.total_tokens if u else 0}}


def _status(fin: Finished | None) -> str:
    """The response's status: ``"incomplete"`` when max_output_tokens ended it."""
    return "incomplete" if fin is not None and fin.finish_reason == "length" else "completed"


def _base(body: ResponsesRequest, req: ChatRequest, started: Started) -> dict[str, Any]:
    """The response object's fields every event and the body repeat."""
    return {"id": req.request_id, "object": "response", "created_at": int(time.time()),
            "model": started.model, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": body.reasoning.model_dump(exclude_none=True) if body.reasoning else {},
            "store": False, "temperature": req.params.temperature, "top_p": req.params.top_p,
            "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)
                     if body.text and body.text.format else {"type": "text"}},
            "tool_choice": body.tool_choice.model_dump(exclude_none=True)
            if isinstance(body.tool_choice, ResponsesToolChoice) else body.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
            "truncation": "disabled", "metadata": {},
            "error": None, "incomplete_details": None, "user": None}


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request):
    req, started, events = await begin(request, body.model, body, to_engine_request, "resp_")
    return await respond(request, events, ResponsesRenderer(_base(body, req, started)),
                         stream=body.stream, fields=RESPONSES_FIELDS)


PROTOCOL = Protocol("openai-responses", router, under("/v1/responses"))
