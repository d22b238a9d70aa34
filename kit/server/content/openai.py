"""Typed content of OpenAI Chat Completions (parts, tool calls, tools, response_format)
and Responses (input items, parts, tools, text.format)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Discriminator, Field, Tag

from kit.server.content.base import (
    Id,
    JSONObject,
    MediaPart,
    Name,
    Part,
    RefusalPart,
    Text,
    TextPart,
    ToolName,
    either,
    one_of,
)
from kit.engine.types import AudioInput, ImageInput
from kit.server.content.media import MediaReader, bad, refuse_file_id


class ChatText(TextPart):
    type: Literal["text", "input_text"]  # input_text: what some Responses-minded clients send


class ChatRefusal(RefusalPart):
    type: Literal["refusal"]


def _image_url(value: Any) -> Any:
    """The URL of an ``image_url`` value: ``{"url": ..., "detail": ...}`` or the URL itself
    (some clients send the string)."""
    return value.get("url") if isinstance(value, dict) else value


def _audio(part: MediaPart, where: str, media: MediaReader) -> AudioInput:
    """``input_audio: {"data": base64, "format": "wav"|"mp3"}``: bounded, then read by a
    model that takes audio (WAV only) or refused (:meth:`MediaReader.audio_base64`)."""
    audio = (part.model_extra or {}).get("input_audio")
    if not isinstance(audio, dict):
        raise bad(where, "input_audio must be an object with data and format",
                  "invalid_audio")
    fmt = audio.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise bad(f"{where}.input_audio.format", "input_audio.format must be a string "
                  "(wav)", "invalid_audio")
    return media.audio_base64(audio.get("data"), fmt, where)


class ChatMedia(MediaPart):
    """``image_url`` (read by a vision model), ``input_audio`` (bounded, then read by a
    model that takes audio or refused), ``file`` (refused)."""

    type: Literal["image_url", "input_audio", "file"]

    def media_of(self, where: str, media: MediaReader) -> ImageInput | AudioInput:
        if self.type == "image_url":
            return media.image_url(_image_url((self.model_extra or {}).get("image_url")),
                                   where)
        if self.type == "input_audio":
            return _audio(self, where, media)
        raise media.refuse(self.type, where)


ChatPart = one_of(ChatText, ChatRefusal, ChatMedia, what="content part")


class ToolCallFunction(Part):
    name: Name
    arguments: either(Text, JSONObject) = "{}"  # a JSON string in the API; objects tolerated


class ChatToolCall(Part):
    id: Id = ""
    type: Literal["function"] = "function"
    function: ToolCallFunction


class FunctionDef(Part):
    name: ToolName
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


# --- OpenAI Responses ----------------------------------------------------------------------

class InputText(TextPart):
    type: Literal["input_text", "output_text", "text"]  # "text": tolerated, as before


class InputRefusal(RefusalPart):
    type: Literal["refusal"]


class InputMedia(MediaPart):
    """``input_image`` (a data URL in ``image_url``; a ``file_id`` is refused),
    ``input_audio`` (as chat's), ``input_file`` (refused)."""

    type: Literal["input_image", "input_file", "input_audio"]

    def media_of(self, where: str, media: MediaReader) -> ImageInput | AudioInput:
        extra = self.model_extra or {}
        if self.type == "input_image":
            if extra.get("image_url") is None and extra.get("file_id") is not None:
                raise refuse_file_id(where)
            return media.image_url(_image_url(extra.get("image_url")), where)
        if self.type == "input_audio":
            return _audio(self, where, media)
        raise media.refuse(self.type, where)


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
    name: ToolName
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
