"""Typed request content every protocol shares: strings, ids, JSON values and the content
parts, tool calls and tool results of Chat Completions, Responses and Messages.

One validation policy for all protocols: every field is a pydantic type, so a malformed
shape is a 400 naming the field (``param`` is the dotted path into the body, e.g.
``messages.0.content.1.text``) and never reaches the adapters as a surprise. The rules:

- strings are valid Unicode (a lone surrogate, which JSON's ``\\ud800`` escape can carry,
  is refused here rather than deep in the tokenizer);
- ids and names (models, tools, call ids) are at most :data:`MAX_ID` characters;
- free JSON (tool parameters, tool inputs, template variables) is at most
  :data:`MAX_DEPTH` levels deep;
- content types and roles are those each API documents; documented ones this server cannot
  honour (images, files, audio) are accepted by the schema and refused by :func:`refuse`
  with a message that says why; undocumented ones are refused by the schema.

Unknown *fields* stay accepted and ignored (``extra="allow"``): clients send many.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
)
from pydantic_core import PydanticCustomError

from kit.server.errors import APIError

MAX_ID = 256  # characters in a model id, tool name, call id
MAX_DEPTH = 64  # nesting levels of free JSON values (tool schemas are a few levels deep)
EXCERPT = 60  # characters of input an error message may quote


def excerpt(value: Any, limit: int = EXCERPT) -> str:
    """``repr(value)`` cut to ``limit`` characters (errors never echo more of the input)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...'"


def _unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError(
            "invalid_unicode", "invalid Unicode: a lone surrogate at character {at}",
            {"at": e.start}) from None
    return value


Text = Annotated[str, AfterValidator(_unicode)]
"""Any valid Unicode string."""

Id = Annotated[str, StringConstraints(max_length=MAX_ID), AfterValidator(_unicode)]
"""An id or a name: valid Unicode, at most :data:`MAX_ID` characters."""

Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID),
                 AfterValidator(_unicode)]
"""A non-empty :data:`Id` (tool and function names)."""


def _json_value(value: Any) -> Any:
    # iterative, not recursive: the depth we check is the depth that would overflow
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise PydanticCustomError("json_too_deep", "nested deeper than {limit} levels "
                                      "(at {where})", {"limit": MAX_DEPTH, "where": where[:80]})
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise PydanticCustomError("invalid_unicode", "invalid Unicode: a lone "
                                          "surrogate (at {where})",
                                          {"where": where[:80] or "the value"}) from None
        elif isinstance(item, dict):
            for k, v in item.items():
                stack.append((k, where, depth))
                stack.append((v, f"{where}.{k}"[:100], depth + 1))
        elif isinstance(item, list):
            stack.extend((v, f"{where}.{i}", depth + 1) for i, v in enumerate(item))
    return value


JSONObject = Annotated[dict[str, Any], AfterValidator(_json_value)]
"""A JSON object: valid Unicode, at most :data:`MAX_DEPTH` levels deep."""


class Part(BaseModel):
    """A content part, item or block: unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")


def _types(model: type[BaseModel]) -> tuple[str, ...]:
    return get_args(model.model_fields["type"].annotation)


def one_of(*models: type[BaseModel], what: str, default: str | None = None) -> Any:
    """A union of ``models`` told apart by their ``type`` field (a ``Literal``).

    ``default`` is the type of an object without one (Responses' message items). An
    unknown or missing type is a 400 at the object, listing the types accepted, without
    echoing the input.
    """
    by_type = {t: m.__name__ for m in models for t in _types(m)}
    names = ", ".join(by_type)

    def tag(value: Any) -> str | None:
        kind = value.get("type", default) if isinstance(value, dict) else \
            getattr(value, "type", None)
        return by_type.get(kind) if isinstance(kind, str) else None

    return Annotated[Union[tuple(Annotated[m, Tag(m.__name__)] for m in models)],
                     Discriminator(tag, custom_error_type=f"invalid_{what}_type",
                                   custom_error_message=f"unknown or missing {what} type "
                                   f"(accepted: {names})")]


def _str_or_other(value: Any) -> str:
    return "str" if isinstance(value, str) else "other"


def either(text: Any, other: Any) -> Any:
    """``text`` for a JSON string, ``other`` for anything else; unlike a plain union,
    an error names only the branch the input was meant for."""
    return Annotated[Union[Annotated[text, Tag("str")], Annotated[other, Tag("other")]],
                     Discriminator(_str_or_other)]


def refuse(kind: str, where: str) -> APIError:
    """The 400 for content this server documents but cannot use (images, files, audio):
    the models it serves read text only."""
    kind = _MEDIA.get(kind, kind)
    return APIError(400, f"{kind} content is not supported by this text-only model",
                    param=where, code="unsupported_content")


_MEDIA = {"image_url": "image", "input_image": "image", "input_audio": "audio",
          "input_file": "file"}


# --- OpenAI Chat Completions ---------------------------------------------------------------

class ChatText(Part):
    type: Literal["text", "input_text"]  # input_text: what some Responses-minded clients send
    text: Text


class ChatRefusal(Part):
    type: Literal["refusal"]
    refusal: Text


class ChatMedia(Part):
    type: Literal["image_url", "input_audio", "file"]


ChatPart = one_of(ChatText, ChatRefusal, ChatMedia, what="content part")


class ToolCallFunction(Part):
    name: Name
    arguments: either(Text, JSONObject) = "{}"  # a JSON string in the API; objects tolerated


class ChatToolCall(Part):
    id: Id = ""
    type: Literal["function"] = "function"
    function: ToolCallFunction


class FunctionDef(Part):
    name: Name
    description: Text | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class ChatTool(Part):
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatToolChoiceFunction(Part):
    name: Name


class ChatToolChoice(Part):
    type: Literal["function"] = "function"
    function: ChatToolChoiceFunction


class JsonSchemaSpec(Part):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: Id | None = None
    description: Text | None = None
    schema_: JSONObject | None = Field(default=None, alias="schema")
    strict: bool | None = None


class FormatText(Part):
    type: Literal["text"]


class FormatJsonObject(Part):
    type: Literal["json_object"]


class ChatFormatJsonSchema(Part):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ChatResponseFormat = one_of(FormatText, FormatJsonObject, ChatFormatJsonSchema,
                            what="response_format")


def chat_text(content: str | list | None, where: str) -> str:
    """The text of a chat message's content (parts joined).

    Raises:
        APIError: 400 for image, audio and file parts (see :func:`refuse`).
    """
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for i, part in enumerate(content):
        if isinstance(part, ChatMedia):
            raise refuse(part.type, f"{where}.{i}")
        texts.append(part.refusal if isinstance(part, ChatRefusal) else part.text)
    return "".join(texts)


# --- OpenAI Responses ----------------------------------------------------------------------

class InputText(Part):
    type: Literal["input_text", "output_text", "text"]  # "text": tolerated, as before
    text: Text


class InputRefusal(Part):
    type: Literal["refusal"]
    refusal: Text


class InputMedia(Part):
    type: Literal["input_image", "input_file", "input_audio"]


InputPart = one_of(InputText, InputRefusal, InputMedia, what="content part")


class MessageItem(Part):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: either(Text, list[InputPart])


class FunctionCallItem(Part):
    type: Literal["function_call"]
    call_id: Id
    name: Name
    arguments: either(Text, JSONObject) = "{}"


class FunctionCallOutputItem(Part):
    type: Literal["function_call_output"]
    call_id: Id
    output: either(Text, list[InputPart])


class HistoryItem(Part):
    """Items documented by the Responses API that carry nothing this server re-sends to
    the model: reasoning, and the calls of hosted tools it does not run."""

    type: Literal["reasoning", "file_search_call", "web_search_call", "computer_call",
                  "computer_call_output", "image_generation_call", "code_interpreter_call",
                  "local_shell_call", "local_shell_call_output", "mcp_list_tools",
                  "mcp_approval_request", "mcp_approval_response", "mcp_call",
                  "custom_tool_call", "custom_tool_call_output"]


class ItemReference(Part):
    type: Literal["item_reference"]
    id: Id


InputItem = one_of(MessageItem, FunctionCallItem, FunctionCallOutputItem, HistoryItem,
                   ItemReference, what="input item", default="message")


class ResponsesFunctionTool(Part):
    type: Literal["function"]
    name: Name
    description: Text | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class HostedTool(Part):
    """A tool of another type (web_search, local_shell, custom...): accepted and not
    offered to the model (this server runs no hosted tools)."""

    type: Id


def _tool_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "function" if kind == "function" else "hosted"


ResponsesTool = Annotated[Union[Annotated[ResponsesFunctionTool, Tag("function")],
                                Annotated[HostedTool, Tag("hosted")]],
                          Discriminator(_tool_tag)]


class ResponsesToolChoice(Part):
    type: Id
    name: Id | None = None


class ResponsesFormatJsonSchema(JsonSchemaSpec):
    type: Literal["json_schema"]


ResponsesFormat = one_of(FormatText, FormatJsonObject, ResponsesFormatJsonSchema,
                         what="text.format")


class TextConfig(Part):
    format: ResponsesFormat | None = None
    verbosity: Id | None = None


class ReasoningConfig(Part):
    effort: Id | None = None
    summary: Id | None = None


def input_text(content: str | list, where: str) -> str:
    """The text of a Responses message's content or function output.

    Raises:
        APIError: 400 for image, file and audio parts.
    """
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if isinstance(part, InputMedia):
            raise refuse(part.type, f"{where}.{i}")
        texts.append(part.refusal if isinstance(part, InputRefusal) else part.text)
    return "".join(texts)


# --- Anthropic Messages --------------------------------------------------------------------

class TextBlock(Part):
    type: Literal["text"]
    text: Text


class MediaBlock(Part):
    type: Literal["image", "document", "search_result", "container_upload"]


class ToolUseBlock(Part):
    type: Literal["tool_use"]
    id: Id
    name: Name
    input: JSONObject = Field(default_factory=dict)


ToolResultPart = one_of(TextBlock, MediaBlock, what="tool_result content block")


class ToolResultBlock(Part):
    type: Literal["tool_result"]
    tool_use_id: Id
    content: either(Text, list[ToolResultPart]) | None = None
    is_error: bool | None = None


class DroppedBlock(Part):
    """Blocks Anthropic documents that carry nothing this server re-sends to the model:
    thinking (templates re-render history without it) and server-tool blocks."""

    type: Literal["thinking", "redacted_thinking", "server_tool_use",
                  "web_search_tool_result", "web_fetch_tool_result",
                  "code_execution_tool_result", "bash_code_execution_tool_result",
                  "text_editor_code_execution_tool_result", "tool_search_tool_result",
                  "mcp_tool_use", "mcp_tool_result"]


Block = one_of(TextBlock, MediaBlock, ToolUseBlock, ToolResultBlock, DroppedBlock,
               what="content block")
SystemBlock = one_of(TextBlock, what="system block")


class AnthropicTool(Part):
    type: Id | None = None  # custom tools; server tools (bash_20250124...) offered by name
    name: Name
    description: Text | None = None
    input_schema: JSONObject = Field(default_factory=lambda: {"type": "object"})


class ChoiceAuto(Part):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ChoiceAny(Part):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ChoiceTool(Part):
    type: Literal["tool"]
    name: Name
    disable_parallel_tool_use: bool | None = None


class ChoiceNone(Part):
    type: Literal["none"]


AnthropicToolChoice = one_of(ChoiceAuto, ChoiceAny, ChoiceTool, ChoiceNone,
                             what="tool_choice")


def block_text(content: str | list | None, where: str) -> str:
    """The text of a string or a list of text blocks (system, tool_result content).

    Raises:
        APIError: 400 for image, document and other non-text blocks.
    """
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for i, block in enumerate(content):
        if isinstance(block, MediaBlock):
            raise refuse(block.type, f"{where}.{i}")
        texts.append(block.text)
    return "".join(texts)


# --- shared translation pieces -------------------------------------------------------------

def function_schema(name: str, description: str | None,
                    parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A tool as the OpenAI function schema chat templates expect."""
    return {"type": "function", "function": {"name": name, "description": description or "",
                                             "parameters": parameters or {}}}


def tool_arguments(arguments: str | dict[str, Any]) -> Any:
    """A tool call's arguments as the mapping templates expect (a JSON string is parsed;
    one that is not JSON is passed on as it is)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments or "{}")
        except ValueError:
            return arguments
    return arguments


def field_path(loc: tuple | list, body: Any) -> str | None:
    """The dotted path into ``body`` that a pydantic error ``loc`` names, without the
    union tags pydantic adds (``str``, ``other``, model names): a segment counts only where
    it indexes the input, or names the missing field at the end.

    E.g. ``("body", "messages", 0, "content", "other", 0, "TextBlock", "text")`` ->
    ``"messages.0.content.0.text"``.
    """
    segments = list(loc[1:]) if loc and loc[0] == "body" else list(loc)
    if not isinstance(body, (dict, list)):  # no body to walk: the loc as it is
        return ".".join(str(s) for s in segments)[:200] or None
    parts: list[str] = []
    cur = body
    for i, seg in enumerate(segments):
        if isinstance(cur, dict) and isinstance(seg, str) and seg in cur:
            parts.append(seg)
            cur = cur[seg]
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cur):
            parts.append(str(seg))
            cur = cur[seg]
        elif i == len(segments) - 1 and isinstance(cur, dict):
            parts.append(str(seg))  # a missing field
    return ".".join(parts)[:200] or None

