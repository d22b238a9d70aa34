"""The rules every protocol's request content follows (see :mod:`kit.server.content`):
valid-Unicode strings, bounded ids and JSON, type-tagged unions whose errors name the
field without echoing the input, and the part kinds every protocol's content is made of
(text, refusal, media: :func:`kit.server.translate.flatten` reads them)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StringConstraints,
    Tag,
)
from pydantic_core import PydanticCustomError

from kit.server.errors import APIError, field_path  # noqa: F401 (field_path: re-exported)

if TYPE_CHECKING:
    from kit.engine.types import ImageInput
    from kit.server.content.media import MediaReader

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


def _unicode_first(value: Any) -> Any:
    # Before the type and length checks: pydantic's own check of a length-bounded string
    # reports a lone surrogate as "unable to parse raw data as a unicode string".
    return _unicode(value) if isinstance(value, str) else value


def bounded_text(max_length: int, min_length: int = 0) -> Any:
    """A string type: valid Unicode (checked first, so a lone surrogate gets the
    ``invalid_unicode`` error, not pydantic's), ``min_length``..``max_length`` characters."""
    # the validator listed after the constraints runs before them (pydantic wraps)
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length),
                     BeforeValidator(_unicode_first)]


Text = Annotated[str, AfterValidator(_unicode)]
"""Any valid Unicode string."""

Id = bounded_text(MAX_ID)
"""An id or a name: valid Unicode, at most :data:`MAX_ID` characters."""

Name = bounded_text(MAX_ID, min_length=1)
"""A non-empty :data:`Id` (tool and function names)."""

#: characters a defined tool's name may not hold: whitespace and control characters, and
#: the punctuation the families' call markup is made of (``<tool_call>``, ``<|call|>``,
#: ``[TOOL_CALLS]``, ``<function=...>``, JSON quotes). A template writes the name into
#: that markup verbatim, so such a name closes the markup early: a forced call stops
#: mid-name and comes back as text, and an unforced one cannot be read back. OpenAI and
#: Anthropic allow only ``[A-Za-z0-9_-]``, Gemini adds ``.:``; this is looser (dots,
#: colons, slashes and non-ASCII letters stay, as MCP and agents' names use them).
_NAME_MARKUP = re.compile(r"[\s\x00-\x1f\x7f<>\[\]{}|\"'`\\]")


def _tool_name(value: str) -> str:
    if (bad := _NAME_MARKUP.search(value)) is not None:
        raise PydanticCustomError(
            "invalid_tool_name", "a tool name may not contain whitespace, quotes or markup "
            "characters ({chars}); found {char} at character {at}",
            {"chars": "<>[]{}|`\\", "char": repr(bad.group()), "at": bad.start()})
    return value


ToolName = Annotated[Name, AfterValidator(_tool_name)]
"""A defined tool's :data:`Name`: no whitespace, quotes or markup characters (see
``_NAME_MARKUP``)."""


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

#: Names a request may not set as chat-template variables: the parameters of transformers'
#: ``apply_chat_template`` (5.x; tests/reliability/test_template_kwargs.py checks the
#: installed signature) and the variables its renderer passes itself. ``chat_template``
#: would run the client's own Jinja in the engine (unbounded loops that block every
#: request); the rest change how the prompt is built or collide with the renderer's own
#: arguments (a TypeError naming Python internals).
RESERVED_TEMPLATE_KEYS = frozenset({
    "conversation", "conversations", "messages", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "sanitize_control_tokens",
    "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs", "kwargs"})


def _template_key(key: str) -> str:
    if key in RESERVED_TEMPLATE_KEYS:
        raise PydanticCustomError(
            "reserved_template_variable", "{key} is set by the server, not by a request "
            "(chat_template_kwargs takes template variables such as enable_thinking)",
            {"key": key})
    return key


TemplateKwargs = Annotated[dict[Annotated[Id, AfterValidator(_template_key)], Any],
                           AfterValidator(_json_value)]
"""Chat-template variables from a request: a :data:`JSONObject` whose keys are none of
:data:`RESERVED_TEMPLATE_KEYS` (an error names ``chat_template_kwargs.<key>``)."""


class LenientModel(BaseModel):
    """A request object that accepts and ignores unknown fields (clients send many)."""

    model_config = ConfigDict(extra="allow")


MAX_TOKENS = 2**31 - 1  # token counts beyond an int32 are mistakes, not requests
#: A number of tokens a client asks for (max_tokens and its kin): a JSON integer in
#: 1..MAX_TOKENS. Strict: ``true``, ``"5"`` and ``5.0`` are 400s naming the field, as
#: OpenAI and Anthropic answer them (lax pydantic would read them as 1 and 5).
TokenCount = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
MAX_STOPS = 64  # stop strings (OpenAI allows 4; agents send a few more)


def number(lo: float, hi: float | None = None, *, above: bool = False) -> Any:
    """A finite float field defaulting to None, in [lo, hi] (``above``: (lo, hi])."""
    bounds = {"gt": lo} if above else {"ge": lo}
    return Field(default=None, le=hi, allow_inf_nan=False, **bounds)


class Part(LenientModel):
    """A content part, item or block: unknown fields are accepted and ignored."""


class TextPart(Part):
    """A part whose ``text`` is what the model reads (:func:`kit.server.translate.flatten`)."""

    type: str  # each subclass narrows it to its Literal (the union's tag)
    text: Text

    def text_of(self, where: str) -> str:
        return self.text


class RefusalPart(Part):
    """An assistant refusal in history: its ``refusal`` text is re-sent as content."""

    type: str
    refusal: Text

    def text_of(self, where: str) -> str:
        return self.refusal


class MediaPart(Part):
    """Content an API documents beyond text (images, files, audio): a text-only model
    refuses it (:meth:`text_of`); a vision model reads its image (:meth:`media_of`)."""

    type: str

    @property
    def kind(self) -> str:
        """``image``, ``audio``, ``file`` or the part's own type (``document``...)."""
        return _MEDIA.get(self.type, self.type)

    def text_of(self, where: str) -> str:
        raise refuse(self.type, where)

    def media_of(self, where: str, media: MediaReader) -> ImageInput:
        """The image this part carries, read and bounded by ``media``
        (:mod:`kit.server.content.media`); each protocol's part reads its own fields.

        Raises:
            APIError: 400 for a part that is not an image (audio after its bounds, files,
                documents), a source that is not inline, or a bound passed.
        """
        raise media.refuse(self.type, where)


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
"""A part's type -> the kind of content it is, for messages."""
