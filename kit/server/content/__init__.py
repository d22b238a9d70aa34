"""Typed request content every protocol shares: strings, ids, JSON values and the content
parts, tool calls and tool results of Chat Completions, Responses and Messages.

One validation policy for all protocols: every field is a pydantic type, so a malformed
shape is a 400 naming the field (``param`` is the dotted path into the body, e.g.
``messages.0.content.1.text``) and never reaches the adapters as a surprise. The rules:

- strings are valid Unicode (a lone surrogate, which JSON's ``\\ud800`` escape can carry,
  is refused here rather than deep in the tokenizer);
- token counts (``max_tokens`` and its kin) are JSON integers (:data:`TokenCount`):
  ``true`` and ``"5"`` are refused, not read as 1 and 5;
- ids and names (models, tools, call ids) are at most :data:`MAX_ID` characters;
- free JSON (tool parameters, tool inputs, template variables) is at most
  :data:`MAX_DEPTH` levels deep;
- content types and roles are those each API documents; documented ones this server cannot
  honour (files, audio; images on a text-only model) are accepted by the schema and
  refused by :func:`refuse` with a message that says why; undocumented ones are refused
  by the schema. A vision model's images are read and bounded by
  :mod:`kit.server.content.media` (:class:`MediaReader`).

Unknown *fields* stay accepted and ignored (``extra="allow"``): clients send many.
"""

from __future__ import annotations

from kit.server.content.base import (  # noqa: F401
    EXCERPT,
    Id,
    JSONObject,
    LenientModel,
    MAX_DEPTH,
    MAX_ID,
    MAX_STOPS,
    MAX_TOKENS,
    MediaPart,
    Name,
    Part,
    RefusalPart,
    RESERVED_TEMPLATE_KEYS,
    TemplateKwargs,
    Text,
    TextPart,
    TokenCount,
    ToolName,
    bounded_text,
    either,
    excerpt,
    field_path,
    number,
    one_of,
    refuse,
)
from kit.server.content.media import MediaLimits, MediaReader  # noqa: F401
from kit.server.content.openai import (  # noqa: F401
    ChatFormatJsonSchema,
    ChatMedia,
    ChatPart,
    ChatRefusal,
    ChatResponseFormat,
    ChatText,
    ChatTool,
    ChatToolCall,
    ChatToolChoice,
    ChatToolChoiceFunction,
    FormatJsonObject,
    FormatText,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionDef,
    HistoryItem,
    HostedTool,
    InputItem,
    InputMedia,
    InputPart,
    InputRefusal,
    InputText,
    ItemReference,
    JsonSchemaSpec,
    MessageItem,
    ReasoningConfig,
    ResponsesFormat,
    ResponsesFormatJsonSchema,
    ResponsesFunctionTool,
    ResponsesTool,
    ResponsesToolChoice,
    TextConfig,
    ToolCallFunction,
)
from kit.server.content.anthropic import (  # noqa: F401
    AnthropicTool,
    AnthropicToolChoice,
    Block,
    ChoiceAny,
    ChoiceAuto,
    ChoiceNone,
    ChoiceTool,
    DroppedBlock,
    MediaBlock,
    SystemBlock,
    TextBlock,
    ToolResultBlock,
    ToolResultPart,
    ToolUseBlock,
)
