"""The translation pieces every protocol shares, as pure functions (no server, no model):
content flattening (a vision model's multimodal content too), tool-call arguments, tool
schemas, tool_choice, reasoning options, sampling overrides, stop strings and ids. Each
protocol module composes them into its one ``to_engine_request(body, defaults, ...) ->
ChatRequest`` and its renderer.

Errors here are the one error tree's ``InvalidRequest`` with a protocol-neutral ``field``
(``tool_choice``...); the protocol's router maps them to its own names
(:func:`kit.server.adapter.protocol_router`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any, Iterable

from kit.engine.types import AudioInput, ImageInput, SamplingParams, ToolCall
from kit.errors import InvalidRequest
from kit.formats.base import EFFORTS as _EFFORTS
from kit.server.content.base import MediaPart, excerpt
from kit.server.content.media import MediaReader
from kit.server.errors import APIError

#: Reasoning efforts that turn a template's thinking off (OpenAI's ``none``/``minimal``,
#: Gemini's ``MINIMAL`` level).
THINKING_OFF = ("none", "minimal")

#: :data:`kit.formats.base.EFFORTS`, the efforts a request may ask for. Templates read the
#: name as given (Kimi K3's knows none/low/high/max), except where the family's format
#: lists its own (gpt-oss writes ``Reasoning: <effort>`` into its system message, trained
#: on low/medium/high: :meth:`kit.formats.base.OutputFormat.template_effort`).
EFFORTS = _EFFORTS

#: A thinking budget (tokens: Anthropic's ``thinking.budget_tokens``) as an effort: up to
#: 4096 low, up to 16384 medium, more high (Claude Code asks 4000 for "think", 10000 for
#: "think hard", 31999 for "ultrathink").
BUDGET_EFFORTS = ((4096, "low"), (16384, "medium"))


def new_id(prefix: str = "") -> str:
    """A fresh id: ``prefix`` + 24 hex digits (``chatcmpl-``, ``msg_``, ``resp_``...)."""
    return prefix + uuid.uuid4().hex[:24]


def flatten(content: str | list | None, where: str) -> str:
    """The text of a message's content: a string as it is (None: ``""``), or the texts of
    a list of typed parts joined (each part's ``text_of``: text and refusals give their
    text, media parts refuse; :mod:`kit.server.content.base`).

    Args:
        content: a string, None, or a list of parts of :mod:`kit.server.content`.
        where: the dotted path of ``content`` in the request, for errors
            (``messages.0.content``); a part's error names ``<where>.<index>``.
    Raises:
        APIError: 400 ``unsupported_content`` for image, audio, file and document parts.
    """
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text_of(f"{where}.{i}") for i, part in enumerate(content))


def message_content(content: str | list | None, where: str, media: MediaReader | None,
                    role: str = "user") -> str | list:
    """A message's content for the engine: with no image in it, the string
    :func:`flatten` makes (so text prompts stay as they were); with images (a vision
    model, ``media.vision``), the multimodal list ``[{"type": "text", "text": str},
    <ImageInput>, ...]`` in the client's order, adjacent texts joined as :func:`flatten`
    joins them. The :class:`ImageInput` items stand where the ``{"type": "image"}`` parts
    go (and :class:`AudioInput` items where ``{"type": "audio"}`` parts go, on a model that
    takes audio): :func:`with_media` swaps them once the request's messages are built.

    Args:
        content: a string, None, or a list of parts of :mod:`kit.server.content`.
        where: the dotted path of ``content`` in the request (``messages.0.content``).
        media: the request's :class:`MediaReader`; None or a text-only model: every media
            part is refused as :func:`flatten` refuses it.
        role: the message's role: only ``user`` and ``tool`` messages take images.
    Raises:
        APIError: 400 for a media part the model cannot take, an image in another role, or
            an image past a bound (:mod:`kit.server.content.media`).
    """
    if media is None or not media.vision or content is None or isinstance(content, str):
        return flatten(content, where)
    return merge([media_part(part, f"{where}.{i}", media, role)
                  if isinstance(part, MediaPart) else part.text_of(f"{where}.{i}")
                  for i, part in enumerate(content)])


def media_part(part: MediaPart, where: str, media: MediaReader | None,
               role: str) -> ImageInput | AudioInput:
    """The image (or audio clip) of one media part of a ``role`` message (the protocols'
    parts read their own fields: :meth:`MediaPart.media_of`).

    Raises:
        APIError: 400 as a text-only model refuses it (``media`` None or not vision), for
            an image in a role that takes none (:data:`IMAGE_ROLES`), or what
            ``media_of`` refuses (other media, a source not inline, a bound passed).
    """
    if media is None or not media.vision:
        part.text_of(where)  # raises: the text-only model's 400
    if part.kind in ("image", "audio") and role not in IMAGE_ROLES:
        raise refuse_image_role(role, where, "images" if part.kind == "image" else "audio")
    return part.media_of(where, media)


#: The roles (the engine's names) whose messages may carry images: what the APIs allow
#: (OpenAI and Anthropic refuse images in assistant turns) and chat templates render (not
#: in a system message).
IMAGE_ROLES = ("user", "tool")


def refuse_image_role(role: str, where: str, kind: str = "images") -> APIError:
    """The 400 for an image (``kind`` ``audio``: a clip) in a ``role`` message that takes
    none (see :data:`IMAGE_ROLES`)."""
    article = "an" if role[:1] in ("a", "e", "i", "o", "u") else "a"
    return APIError(400, f"{where}: {article} {role} message cannot carry {kind} (user "
                    "messages and tool results can)", param=where, code="unsupported_content")


def merge(parts: list[str | ImageInput | AudioInput]) -> str | list:
    """Texts, images and audio clips in order as a message's content: the texts joined
    when there is no media, else ``{"type": "text"}`` items (adjacent texts joined, empty
    ones dropped) around the media (see :func:`message_content`)."""
    if all(isinstance(p, str) for p in parts):
        return "".join(parts)  # type: ignore[arg-type]
    out: list[Any] = []
    text: list[str] = []
    for p in parts:
        if isinstance(p, str):
            text.append(p)
            continue
        if "".join(text):
            out.append({"type": "text", "text": "".join(text)})
        text = []
        out.append(p)
    if "".join(text):
        out.append({"type": "text", "text": "".join(text)})
    return out


def with_media(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A :class:`ChatRequest`'s ``messages``, ``images`` and ``audio``: the messages with
    each :class:`ImageInput` of their content lists replaced by ``{"type": "image"}`` and
    each :class:`AudioInput` by ``{"type": "audio"}``, and the images and clips in that
    order (the i-th image part across the messages is ``images[i]``, the same for audio),
    whatever order the protocol built the messages in. The messages are returned as they
    are when no content is a list."""
    images: list[ImageInput] = []
    audio: list[AudioInput] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for k, item in enumerate(content):
                if isinstance(item, ImageInput):
                    images.append(item)
                    content[k] = {"type": "image"}
                elif isinstance(item, AudioInput):
                    audio.append(item)
                    content[k] = {"type": "audio"}
    return {"messages": messages, "images": tuple(images), "audio": tuple(audio)}


def function_schema(name: str, description: str | None,
                    parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A tool as the OpenAI function schema chat templates expect
    (``{"type": "function", "function": {"name", "description", "parameters"}}``)."""
    return {"type": "function", "function": {"name": name, "description": description or "",
                                             "parameters": parameters or {}}}


def tool_arguments(arguments: str | dict[str, Any]) -> Any:
    """A tool call's arguments in history as the mapping templates expect (a JSON string is
    parsed; one that is not JSON is passed on as it is)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments or "{}")
        except ValueError:
            return arguments
    return arguments


def call_arguments(call: ToolCall) -> Any:
    """A generated call's arguments (a JSON string, OpenAI's shape) as a JSON value for the
    protocols that send objects (Anthropic ``input``, Gemini ``args``); text that is not
    JSON comes back as ``{"_raw": text}``."""
    try:
        return json.loads(call.arguments or "{}")
    except ValueError:
        return {"_raw": call.arguments}


def history_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One assistant ``tool_calls`` entry of the engine's messages (arguments a mapping)."""
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def history_reasoning(message: dict[str, Any], reasoning: str | None) -> dict[str, Any]:
    """An assistant turn of the engine's messages with the reasoning a client sent back,
    under the names chat templates read: ``reasoning_content`` (Qwen3, GLM, Kimi,
    DeepSeek...) and ``thinking`` (gpt-oss, whose template renders it as the analysis of a
    tool-call turn). Not ``thinking`` beside content on a tool-call turn: gpt-oss's template
    refuses both there and renders the content as the analysis itself. Returns
    ``message``, changed in place."""
    if reasoning:
        message["reasoning_content"] = reasoning
        if not (message.get("tool_calls") and message.get("content")):
            message["thinking"] = reasoning
    return message


def reasoning_text(parts: Any) -> str:
    """The text of a Responses ``reasoning`` item's ``content`` (its ``reasoning_text``
    parts joined; anything else in it is ignored: the item is not validated further)."""
    if not isinstance(parts, list):
        return ""
    return "".join(p["text"] for p in parts if isinstance(p, dict)
                   and p.get("type") == "reasoning_text" and isinstance(p.get("text"), str))


def choose_tools(tools: list[dict[str, Any]], kind: str, name: str | None,
                 supports_tools: bool) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The tools to hand the chat template (OpenAI function schemas) and the call to
    force (``ChatRequest.force_tool``), for every protocol.

    ``kind``: ``none`` hides the tools; ``auto`` passes them all and lets the model decide;
    ``required`` forces a call to one of them (force ``""``); ``named`` forces a call to
    ``name``. The template always gets every tool, so the prompt (and its cache) does not
    change with ``tool_choice``. Tools sent to a model without tool support reach its
    template, which ignores them (``capabilities.tools`` in /v1/models says so).

    Raises:
        InvalidRequest: field ``tool_choice``, for an unknown kind, a forced call without
            tools, on a model without tool support, or naming a tool not in ``tools``.
    """
    def bad(message: str, code: str = "invalid_value") -> InvalidRequest:
        return InvalidRequest(message, code=code, field="tool_choice")

    if kind not in ("auto", "none", "required", "named"):
        raise bad(f"tool_choice {excerpt(kind)} is not supported (auto, none, required, "
                  "or a function)")
    if kind in ("required", "named") and not tools:
        raise bad("tool_choice requires a tool call, but no (function) tools were given")
    if not tools or kind == "none":
        return None, None
    if kind == "auto":
        return tools, None
    if not supports_tools:
        raise bad("tool_choice requires a tool call, but the loaded model's chat template "
                  "has no tool-call support", code="unsupported_value")
    if kind == "required":
        return tools, ""
    if not isinstance(name, str) or not name:
        raise bad("tool_choice must name a function")
    if not any(t["function"]["name"] == name for t in tools):
        raise bad(f"tool_choice names {excerpt(name)}, which is not in tools")
    return tools, name


def thinking_kwargs(effort: str | None, *, budget: int | None = None,
                    field: str = "reasoning_effort") -> dict[str, Any]:
    """Reasoning options as chat-template variables: ``reasoning_effort`` (when given) and
    ``enable_thinking`` (off for an effort in :data:`THINKING_OFF` or a budget of 0
    tokens); ``{}`` when neither is given.

    Args:
        effort: one of :data:`EFFORTS`, or None.
        budget: a thinking budget in tokens (0: no thinking), or None.
        field: the request field ``effort`` came from, for the error.
    Raises:
        InvalidRequest: ``effort`` is not one of :data:`EFFORTS` (400 naming ``field``).
    """
    if effort is None and budget is None:
        return {}
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest(f"{field} {excerpt(effort, 40)} is not supported (one of "
                             f"{', '.join(EFFORTS)})", code="invalid_value", field=field)
    kwargs: dict[str, Any] = {}
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    kwargs["enable_thinking"] = effort not in THINKING_OFF and budget != 0
    return kwargs


def budget_effort(budget: int | None) -> str | None:
    """The effort of a thinking budget in tokens (see :data:`BUDGET_EFFORTS`); None for
    no budget or a negative one (Gemini's -1: the model decides)."""
    if budget is None or budget < 0:
        return None
    if budget == 0:
        return "none"
    return next((effort for limit, effort in BUDGET_EFFORTS if budget <= limit), "high")


def stop_strings(stops: Iterable[str] | None) -> tuple[str, ...]:
    """The stop strings to match (empty ones dropped: they would match at once)."""
    return tuple(s for s in stops or () if s)


def output_cap(max_tokens: int | None, context_window: int | None) -> int | None:
    """A max-tokens cap (Anthropic's, Gemini's) as the engine's ``max_tokens``: None, which
    the engine fits to what is left of the window, when it is omitted or reaches the whole
    window (clients send large values: Claude Code 32000)."""
    if max_tokens is None or context_window is not None and max_tokens >= context_window:
        return None
    return max_tokens


def overridden(defaults: SamplingParams, **fields: Any) -> SamplingParams:
    """``defaults`` with each of ``fields`` that the request set (not None) replacing it."""
    return replace(defaults, **{k: v for k, v in fields.items() if v is not None})
