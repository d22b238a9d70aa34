"""Mistral, Magistral, Ministral and Devstral tool calls: mlx-lm's ``mistral`` parser with
what it gets wrong corrected here.

The formats (mistral-common's tokenizer versions): v3 writes
``[TOOL_CALLS] [{"name": ..., "arguments": {...}}]``; v11 and later
``[TOOL_CALLS]name[ARGS]{...}``, repeated for parallel calls, and v11 tokenizers also define
``[CALL_ID]``: ``[TOOL_CALLS]name[CALL_ID]a1b2c3d4e[ARGS]{...}``. Reasoning models of v13+
think between the control tokens ``[THINK]`` and ``[/THINK]``; Magistral Small 2506 (v11)
writes plain-text ``<think>...</think>`` as its default system prompt asks (selected from
the template in :func:`kit.formats.select.detect`).

Upstream bugs corrected (mlx-lm 0.32 ``mlx_lm/tool_parsers/mistral.py`` and the state
machine mlx-lm builds around a parser):

1. ``[CALL_ID]``: its header regex ``([\\w-]+)\\s*\\[ARGS\\]`` matches the text right before
   ``[ARGS]``, so ``special_function[CALL_ID]123456789[ARGS]{...}`` becomes a call of a tool
   named ``123456789``. Here the header reads an optional ``[CALL_ID]id`` between the name
   and ``[ARGS]``, and the model's id is kept as the call's id.
2. A tool call inside reasoning: mlx-lm lets ``[TOOL_CALLS]`` start a call from the
   reasoning state, so reasoning that mentions (or drafts) a call is cut at the marker and
   the draft is returned as a real call. Mistral's reasoning is closed by ``[/THINK]``
   before any call (mistral-common's grammar), so inside ``[THINK]`` everything is
   reasoning (:class:`MistralOutputParser`).
3. Arguments that are no JSON object: mlx-lm takes any JSON value after ``[ARGS]``
   (``name[ARGS]"x"`` or ``[ARGS]1``) as the arguments, which then reach the client as
   arguments that are not a JSON object (or not JSON at all). Here they must be an object
   (or a JSON string holding one), else the text is no call.
4. A call cut by ``max_tokens``: mlx-lm drops it. Here the complete calls before the cut
   are kept (:func:`parse_partial`), and with none the cut text comes back as answer text.
"""

from __future__ import annotations

import json
from typing import Any

import regex as re

from kit import mlx_lm_api
from kit.formats.events import TextDelta
from kit.formats.output import OutputParser

# mlx-lm's mistral parser (imports mlx: a format module loads with a model only)
_upstream = mlx_lm_api.tool_parser("mistral")

tool_call_start = _upstream.tool_call_start  # [TOOL_CALLS]
tool_call_end = _upstream.tool_call_end  # none: the calls run to the end of the output

# name, then an optional [CALL_ID]id (v11 tokenizers), then [ARGS] and the JSON arguments
_HEADER = re.compile(r"([\w-]+)(?:\[CALL_ID\]([\w-]*))?\s*\[ARGS\]\s*")


def _header_calls(text: str, *, partial: bool) -> list[dict[str, Any]]:
    """``name[CALL_ID]id[ARGS]{...}`` calls (the id optional), repeated. ``partial``: stop
    at the first call whose JSON does not decode (the output was cut there)."""
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while (match := _HEADER.search(text, pos)) is not None:
        try:
            arguments, pos = decoder.raw_decode(text, match.end())
            if isinstance(arguments, str):  # arguments rendered as a JSON string
                arguments = json.loads(arguments)
            if not isinstance(arguments, dict):
                raise ValueError("the arguments are not a JSON object")
        except ValueError as e:
            if partial:
                break
            raise ValueError(f"Could not parse tool call from: {text}") from e
        call = {"name": match.group(1), "arguments": arguments}
        if match.group(2):
            call["id"] = match.group(2)
        calls.append(call)
    return calls


def _is_json_list(text: str) -> bool:
    try:
        return isinstance(json.loads(text), list)
    except ValueError:
        return False


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any] | list[dict[str, Any]]:
    """The calls in the text after ``[TOOL_CALLS]`` (mlx-lm's parser contract): a v3 JSON
    array (mlx-lm's parser, which is right for it), else v11+ headers with ``[CALL_ID]``.

    Raises:
        ValueError: the text holds no complete call.
    """
    if _is_json_list(text):
        return _upstream.parse_tool_call(text, tools)
    calls = _header_calls(text, partial=False)
    if not calls:
        raise ValueError(f"Could not parse tool call from: {text}")
    return calls[0] if len(calls) == 1 else calls


def parse_partial(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The complete calls of a call text cut by ``max_tokens`` (a v3 array counts only
    once it closed: it is one JSON value)."""
    return _header_calls(text, partial=True)


class MistralOutputParser(OutputParser):
    """:class:`OutputParser` whose reasoning state has no tool-call transition (upstream
    bug 2 above), and which returns a cut call without a complete call as answer text."""

    def __init__(self, *, think: tuple[str, str] | None = None,
                 extra: dict[str, list[tuple[str, str]]] | None = None,
                 parse_partial: Any = None, **kw: Any) -> None:
        extra = dict(extra or {})
        if think:  # the reasoning transitions, built here without the tool start in them
            extra["normal"] = [(think[0], "reasoning"), *extra.get("normal", [])]
            extra["reasoning"] = [(think[1], "normal"), *extra.get("reasoning", [])]
        super().__init__(think=None, extra=extra,
                         parse_partial=parse_partial, **kw)


    def cut_call_text(self, text: str, *, said: bool) -> str:
        """A cut call without a complete call comes back as answer text, whatever came
        before it (see :meth:`OutputParser.cut_call_text`)."""
        return text


OVERRIDES = {"parser_class": MistralOutputParser}
