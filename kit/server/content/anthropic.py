"""Typed content of Anthropic Messages: blocks, tool results, tools, tool_choice."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kit.server.content.base import (
    Id,
    JSONObject,
    MediaPart,
    Name,
    Part,
    Text,
    TextPart,
    ToolName,
    either,
    one_of,
)
from kit.engine.types import ImageInput
from kit.server.content.media import MediaReader, bad, refuse_file_id, refuse_remote


class TextBlock(TextPart):
    type: Literal["text"]


class MediaBlock(MediaPart):
    """``image`` (read by a vision model from ``source.type=base64``; ``url`` and ``file``
    sources are refused), ``document`` and the rest (refused)."""

    type: Literal["image", "document", "search_result", "container_upload"]

    def media_of(self, where: str, media: MediaReader) -> ImageInput:
        if self.type != "image":
            raise media.refuse(self.type, where)
        source = (self.model_extra or {}).get("source")
        kind = source.get("type") if isinstance(source, dict) else None
        if kind == "base64":
            return media.image_base64(source.get("data"), where)
        if kind == "url":
            raise refuse_remote(where)
        if kind == "file":
            raise refuse_file_id(where)
        raise bad(where, "an image block needs a source of type base64 (with media_type "
                  "and data)", "invalid_image")


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
    name: ToolName
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
