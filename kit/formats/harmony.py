"""gpt-oss's Harmony output: messages on channels, reasoning, preambles, answers and tool calls.

After the generation prompt's ``<|start|>assistant`` the model writes one or more messages::

    [<|start|>ROLE][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ TYPE|<|constrain|>TYPE]
    <|message|>BODY  then <|end|> (more messages follow), <|call|> or <|return|> (both EOS)

Routing, by the header (OpenAI's Harmony format spec, docs/format.md of openai/harmony, and
gpt-oss's chat_template.jinja): a message with a recipient ``functions.NAME`` (in the role
part or after the channel, on whatever channel) is a call of NAME with BODY as its JSON
arguments; ``analysis`` is reasoning; ``final`` is the answer; ``commentary`` without a
recipient is a preamble the user sees (content), and so is a channel the spec does not
name. A recipient that is no offered function (the built-in ``python`` / ``browser.*``
tools, which this server never offers) is not a call: its body is dropped, as llama.cpp
does. A header without ``<|message|>`` (malformed: ended by ``<|end|>``, ``<|start|>`` or a
second ``<|channel|>``) comes back as text, never as an error.

Ends: a text body ends at ``<|end|>`` or ``<|return|>`` only, so marker text a model quotes
in its reasoning (``<|call|>``, ``<|channel|>``) stays reasoning; a call's JSON body ends at
the first ``<|call|>`` / ``<|end|>`` / ``<|return|>`` outside a JSON string, so an argument
that quotes a marker stays in the call. ``<|call|>`` and ``<|return|>`` are EOS tokens the
engine never feeds, so a call usually ends where generation does.

Why not ``openai-harmony`` (OpenAI's own library for the format, 0.0.8): its parsers
(``StreamableParser.process(token)``, ``parse_messages_from_completion_tokens``) take o200k
token ids, while the engine's parser is fed detokenized text (so are the conformance replay
and every other family's parser); and loading its encoding downloads
``o200k_base.tiktoken`` (SHA-256 checked) from openaipublic.blob.core.windows.net on first
use, so offline (this machine, CI, many Macs) ``load_harmony_encoding`` fails with "error
downloading or loading vocab file". ``TIKTOKEN_ENCODINGS_BASE`` / ``TIKTOKEN_RS_CACHE_DIR``
can point it at a local copy, but only the exact file passes its hash check; rebuilding it
from a checkpoint's tokenizer.json could not be tried (no gpt-oss tokenizer here) and would
still leave the token-id interface. Its Python API has nothing that works without the
vocab (``Message``/``Conversation`` are pydantic models for rendering). So the text-level
parser is written here; it follows the spec and the library's documented leniencies
(recipient before or after the channel, ``<|constrain|>`` with or without a space).

This module is the format's entry point (mlx-lm's parser-module contract); the markup
(tokens, headers, arguments) is in ``_harmony_markup.py``, the engine's parser
(:class:`HarmonyParser`) in ``_harmony_parser.py``.
"""

from __future__ import annotations

from typing import Any

from kit.formats._harmony_markup import (
    CALL,
    CALL_ENDS,
    CHANNEL,
    CONSTRAIN,
    END,
    Header,
    MAX_HEADER,
    MESSAGE,
    RETURN,
    SPECIALS,
    START,
    TEXT_ENDS,
    arguments,
    callee,
    find_first,
)
from kit.formats._harmony_parser import HarmonyParser
from kit.formats.base import JsonMarkerEnd

__all__ = ["CALL", "CALL_ENDS", "CHANNEL", "CONSTRAIN", "END", "MAX_HEADER", "MESSAGE",
           "RETURN", "SPECIALS", "START", "TEXT_ENDS", "Header", "HarmonyParser", "arguments",
           "call_end", "callee", "parse_partial", "parse_tool_call", "tool_call_end",
           "tool_call_start"]

#: mlx-lm's parser-module contract: a forced call's prompt ends with ``<|start|>assistant``
#: and this; the model writes ``NAME<|channel|>commentary json<|message|>{...}`` and EOS
tool_call_start = " to=functions."
tool_call_end = CALL


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any]:
    """mlx-lm's contract: the text after :data:`tool_call_start` (``NAME<|channel|>...
    <|message|>{...}``, up to the end marker) as ``{"name", "arguments"}``.

    Raises:
        ValueError: no ``<|message|>``, no function name, or the body is not a JSON object.
    """
    head, sep, body = text.partition(MESSAGE)
    if not sep:
        raise ValueError("no <|message|> after the call's header")
    header = Header(tool_call_start + head)
    name = (header.recipient or "").removeprefix("functions.")
    if not name:
        raise ValueError("the call names no function")
    if header.json:
        end = JsonMarkerEnd(*CALL_ENDS)(body)
        i = -1 if end is None else end[0]
    else:
        i = find_first(body, CALL_ENDS)[0]
    return {"name": name, "arguments": arguments(body if i < 0 else body[:i])}


def parse_partial(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The complete calls of a call cut by ``max_tokens``: the call itself when its JSON
    body happens to be complete, else none."""
    try:
        return [parse_tool_call(text, tools)]
    except ValueError:
        return []


def call_end(text: str) -> tuple[int, int] | None:
    """Where a call's text (after :data:`tool_call_start`) ends: the first end marker after
    ``<|message|>`` outside a JSON string (prefix-stable)."""
    i = text.find(MESSAGE)
    if i < 0:
        return None
    start = i + len(MESSAGE)
    end = JsonMarkerEnd(*CALL_ENDS)(text[start:])
    return None if end is None else (start + end[0], start + end[1])


#: the parser, and the reasoning efforts gpt-oss's template was trained on (its system
#: message says ``Reasoning: low|medium|high``; openai-harmony's ReasoningEffort has those)
OVERRIDES = {"parser_class": HarmonyParser, "efforts": ("low", "medium", "high")}
