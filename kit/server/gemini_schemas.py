"""The Gemini API's request bodies (``generateContent``, ``countTokens``) as pydantic models,
and the conversion of Gemini's OpenAPI-style ``Schema`` to JSON Schema.

Field names are Google's lowerCamelCase (``systemInstruction``, ``functionDeclarations``);
the proto field names (``system_instruction``) are accepted too, as Google's JSON mapping
does. Unknown fields are accepted and ignored, as in the other protocols. Every list and
string is bounded, so a bad request gets a 400 naming the field, never a 500.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from kit.server.content.base import JSONObject, TokenCount, bounded_text

#: Bounds on what one request may carry (Google's own limits where it documents one:
#: 5 stop sequences; the rest are far above what any agent sends).
MAX_TEXT = 4_000_000          # characters in one text part (~1M tokens)
MAX_CONTENTS = 10_000         # turns
MAX_PARTS = 1_000             # parts per turn
MAX_FUNCTIONS = 512           # function declarations over all tools
MAX_NAME = 128                # function name length


class G(BaseModel):
    """A Gemini request object: camelCase names (snake_case accepted), extra fields ignored."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)


#: Strings of the request content: valid Unicode (a lone surrogate gets the same
#: "invalid Unicode" 400 as in the other protocols), bounded.
PartText = bounded_text(MAX_TEXT)
FunctionName = bounded_text(MAX_NAME, min_length=1)
CallId = bounded_text(256)


class FunctionCall(G):
    name: FunctionName
    args: JSONObject | None = None
    id: CallId | None = None


class FunctionResponse(G):
    name: FunctionName
    response: JSONObject | None = None
    id: CallId | None = None
    parts: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_PARTS)


#: A part's data fields (Google's ``Part.data`` oneof): exactly one is set.
PART_DATA = {"text": "text", "function_call": "functionCall",
             "function_response": "functionResponse", "inline_data": "inlineData",
             "file_data": "fileData", "executable_code": "executableCode",
             "code_execution_result": "codeExecutionResult"}


class Part(G):
    """One part of a turn: exactly one data field (text / functionCall / functionResponse;
    the media and code-execution ones are refused by the router, text-only models) and
    optional metadata (``thought``, ``thoughtSignature``...). Unknown fields are a 400, as
    Google answers them ("Unknown name"): a part the server cannot read is not dropped.

    Raises (as a validation error at the part): no data field, or more than one.
    """

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    text: PartText | None = None
    thought: bool | None = None
    thought_signature: PartText | None = None
    part_metadata: JSONObject | None = None
    video_metadata: JSONObject | None = None
    media_resolution: JSONObject | str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None
    inline_data: dict[str, Any] | None = None
    file_data: dict[str, Any] | None = None
    executable_code: dict[str, Any] | None = None
    code_execution_result: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_data_field(self) -> "Part":
        given = [camel for field, camel in PART_DATA.items() if getattr(self, field) is not None]
        if len(given) != 1:
            raise PydanticCustomError(
                "invalid_part", "a part needs exactly one of {fields} ({got})",
                {"fields": ", ".join(PART_DATA.values()),
                 "got": "none given" if not given else "got " + ", ".join(given)})
        return self


class Content(G):
    # "function" is the older role of turns that carry functionResponse parts
    role: Literal["user", "model", "function"] | None = None
    parts: list[Part] = Field(min_length=1, max_length=MAX_PARTS)


class FunctionDeclaration(G):
    name: str = Field(min_length=1, max_length=MAX_NAME,
                      pattern=r"^[A-Za-z_][A-Za-z0-9_.:\-]*$")
    description: str | None = Field(default=None, max_length=MAX_TEXT)
    parameters: dict[str, Any] | None = None
    parameters_json_schema: dict[str, Any] | None = None


#: Tool kinds Google runs on its side (search, code execution...): refused with a 400.
SERVER_TOOLS = ("googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext",
                "retrieval", "computerUse", "fileSearch", "googleMaps",
                "enterpriseWebSearch")


class Tool(G):
    function_declarations: list[FunctionDeclaration] | None = Field(default=None,
                                                                     max_length=MAX_FUNCTIONS)


class FunctionCallingConfig(G):
    mode: Literal["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"] = "AUTO"
    allowed_function_names: list[str] | None = Field(default=None, max_length=MAX_FUNCTIONS)

    @field_validator("mode", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class ToolConfig(G):
    function_calling_config: FunctionCallingConfig | None = None


class ThinkingConfig(G):
    include_thoughts: bool | None = None
    # -1: dynamic, 0: off
    thinking_budget: StrictInt | None = Field(default=None, ge=-1, le=2**31 - 1)
    thinking_level: Literal["THINKING_LEVEL_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM",
                            "HIGH"] | None = None

    @field_validator("thinking_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class GenerationConfig(G):
    stop_sequences: list[str] | None = Field(default=None, max_length=5)
    candidate_count: int | None = Field(default=None, ge=1)
    max_output_tokens: TokenCount | None = None
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=-2**31, lt=2**31)  # Gemini's is an int32
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    response_mime_type: str | None = Field(default=None, max_length=100)
    response_schema: dict[str, Any] | None = None
    response_json_schema: dict[str, Any] | None = None
    response_modalities: list[str] | None = Field(default=None, max_length=8)
    response_logprobs: bool | None = None
    logprobs: int | None = None
    speech_config: dict[str, Any] | None = None
    thinking_config: ThinkingConfig | None = None


class GenerateContentRequest(G):
    """``models.generateContent`` / ``models.streamGenerateContent``."""

    model: str | None = Field(default=None, max_length=512)  # in countTokens' copy only
    contents: list[Content] = Field(min_length=1, max_length=MAX_CONTENTS)
    system_instruction: Content | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_FUNCTIONS)
    tool_config: ToolConfig | None = None
    generation_config: GenerationConfig | None = None
    safety_settings: list[dict[str, Any]] | None = Field(default=None, max_length=64)
    cached_content: str | None = Field(default=None, max_length=512)


class CountTokensRequest(G):
    """``models.countTokens``: ``contents`` alone, or a whole ``generateContentRequest``."""

    contents: list[Content] | None = Field(default=None, max_length=MAX_CONTENTS)
    generate_content_request: GenerateContentRequest | None = None


# Gemini's Schema is an OpenAPI 3.0 subset with upper-case type enums; JSON Schema, which
# the chat templates and the constrained decoder take, has lower-case types and no
# `nullable`. No library converts between the two, so this walk is our own.
_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}
_INT_KEYS = {"minItems", "maxItems", "minLength", "maxLength", "minProperties",
             "maxProperties"}  # int64 fields, which Google's JSON mapping sends as strings
_DROP_KEYS = {"propertyOrdering", "example"}
_DROP_FORMATS = {"enum", "int32", "int64", "float", "double"}
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains")


def _type(t: Any) -> Any:
    if isinstance(t, str) and t.upper() in _TYPES:
        return t.lower()
    if isinstance(t, list):
        return [_type(x) for x in t]
    return t


def to_json_schema(schema: Any, depth: int = 0) -> Any:
    """A JSON Schema for a Gemini ``Schema`` (``{"type": "OBJECT", "properties": ...,
    "nullable": true}``) or a JSON Schema that uses Gemini's upper-case type names (as
    Gemini CLI's ``responseJsonSchema`` does). Types become lower-case, ``nullable`` becomes
    a ``"null"`` type, int64 strings become ints, OpenAPI-only keys are dropped; everything
    else is kept. Non-dict input is returned as is.

    Raises:
        ValueError: nesting deeper than 64 levels.
    """
    if not isinstance(schema, dict):
        return schema
    if depth > 64:
        raise ValueError("schema nesting is deeper than 64 levels")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP_KEYS or key == "nullable":
            continue
        if key == "type":
            value = _type(value)
            if value == "type_unspecified" or (isinstance(value, str)
                                               and value.upper() == "TYPE_UNSPECIFIED"):
                continue
        elif key == "format" and value in _DROP_FORMATS:
            continue
        elif key in _INT_KEYS and isinstance(value, str) and value.isdigit():
            value = int(value)
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            value = {k: to_json_schema(v, depth + 1) for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            value = [to_json_schema(v, depth + 1) for v in value]
        elif key in _SCHEMA_ONE:
            value = [to_json_schema(v, depth + 1) for v in value] if isinstance(value, list) \
                else to_json_schema(value, depth + 1)
        out[key] = value
    if schema.get("nullable") is True:
        t = out.get("type")
        if isinstance(t, str):
            out["type"] = [t, "null"]
        elif isinstance(t, list) and "null" not in t:
            out["type"] = t + ["null"]
        elif "anyOf" in out:
            out["anyOf"] = out["anyOf"] + [{"type": "null"}]
    return out
