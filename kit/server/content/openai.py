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


class ChatText(TextPart):
    type: Literal["text", "input_text"]  # input_text: what some Responses-minded clients send


class ChatRefusal(RefusalPart):
    type: Literal["refusal"]


class ChatMedia(MediaPart):
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
