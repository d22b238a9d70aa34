"""The grammars of forced tool calls, one body per tool format, in the family's own markup.

Forced tool calls: the prompt gets the format's tool-call start marker (e.g.
``<tool_call>``, ``[TOOL_CALLS]``), so the model is inside a call from its first token. For
tool-call formats whose body we know (:data:`TOOL_CALL_BODIES`, keyed by the tool format's
name: json_tools, qwen3_coder, glm47, mistral, kimi_k2, gemma4, harmony, and DeepSeek's
from its module) the body is constrained too, in the family's own markup: the function
name is one of the allowed tools and the arguments follow that tool's JSON schema (as
JSON, or as the bare strings and ``<|"|>``-quoted values the key-value formats write). For
other formats only the start marker is forced and the model writes the body. The markers
inside a body are written as text; :func:`kit.engine.decode.grammar.special_token_refs` turns
those that are special tokens of the loaded vocab into token references.

Written here: no library writes tool-call grammars from a family's markup; llguidance
compiles them (:mod:`kit.engine.decode.grammar`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kit.formats.select import ours


class _Rules:
    """The Lark rules one tool's calls are built from: ``add`` names a rule body once
    (the same body again gets the same name, so a tool's arguments are one rule however
    many numbered calls refer to them)."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.lines, self._names = prefix, [], {}

    def add(self, body: str) -> str:
        if body not in self._names:
            self._names[body] = f"{self.prefix}_{len(self._names)}"
            self.lines.append(f"{self._names[body]}: {body}")
        return self._names[body]


def _properties(schema: Any) -> list[tuple[str, Any, bool]]:
    """``(key, sub-schema, required)`` of an object schema's declared properties, in
    order ([] for any other schema)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    required = set(schema.get("required") or ())
    return [(str(k), v, k in required) for k, v in schema["properties"].items()]


def _value(rules: _Rules, schema: Any) -> str:
    """A rule for one JSON value following ``schema`` (llguidance's ``%json``; unknown
    keywords ignored, as for the arguments object)."""
    sub = _closed(dict(schema)) if isinstance(schema, dict) else {}
    sub["x-guidance"] = {**_JSON_OPTIONS, "lenient": True}
    return rules.add("%json " + json.dumps(sub))


def _sequence(rules: _Rules, items: list[tuple[str, bool]], sep: str) -> str:
    """A rule for ``items`` (``(rule expression, required)``) in order, the optional ones
    present or not, ``sep`` (a Lark literal, or "") between the present ones. One rule per
    (position, anything before it), so the grammar grows linearly with the items."""
    memo: dict[tuple[int, bool], str] = {}

    def rest(i: int, preceded: bool) -> str:
        if i == len(items):
            return '""'
        if (i, preceded) not in memo:
            expr, required = items[i]
            here = f"{sep if preceded and sep else ''} {expr} {rest(i + 1, True)}".strip()
            memo[i, preceded] = rules.add(here if required
                                          else f"({here}) | {rest(i + 1, preceded)}")
        return memo[i, preceded]

    return rest(0, False)


def _raw_string(schema: Any) -> bool:
    """A value the key-value formats (qwen3_coder, glm47) write as bare text, not JSON."""
    return isinstance(schema, dict) and schema.get("type") == "string"


def _bare_string(schema: dict, quote: str = "") -> str:
    """A string value written without JSON quoting (between ``quote`` delimiters, if any):
    one of its ``enum`` / ``const`` strings when it lists them, else text without ``<``
    (the next markup) within ``minLength`` / ``maxLength``, one line when not delimited
    (a 135M model given newlines writes them until max_tokens)."""
    choices = schema.get("enum") if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if choices and all(isinstance(c, str) for c in choices):
        return "(" + " | ".join(_lark_str(quote + c + quote) for c in choices) + ")"
    low, high = schema.get("minLength"), schema.get("maxLength")
    low = low if isinstance(low, int) and low >= 0 else (0 if quote else 1)
    span = f"{{{low},{high}}}" if isinstance(high, int) and high >= low else (
        "+" if low == 1 else "*" if low == 0 else f"{{{low},}}")
    text = f"/[^<{'' if quote else chr(92) + 'n'}]{span}/"
    return f"{_lark_str(quote)} {text} {_lark_str(quote)}" if quote else text


def _key_value_body(rules: _Rules, schema: Any, key: Callable[[str], tuple[str, str]],
                    ) -> str:
    """The parameters of a key-value format: one ``open value close`` item per declared
    property (``key(name) -> (open, close)`` literals), strings bare, others JSON."""
    items = []
    for name, sub, required in _properties(schema):
        open_, close = key(name)
        value = _bare_string(sub) if _raw_string(sub) else _value(rules, sub)
        items.append((f"{_lark_str(open_)} {value} {_lark_str(close)}", required))
    return _sequence(rules, items, "")


def _gemma_value(rules: _Rules, schema: Any) -> str:
    """A Gemma 4 value: objects with bare keys, strings between ``<|"|>`` delimiters,
    other scalars as JSON (its template's ``format_argument``)."""
    s = schema if isinstance(schema, dict) else {}
    kind = s.get("type")
    if kind == "string":
        return rules.add(_bare_string(s, _GEMMA_QUOTE))
    if kind == "object" and _properties(s):
        items = [(f"{_lark_str(k + ':')} {_gemma_value(rules, v)}", req)
                 for k, v, req in _properties(s)]
        return rules.add(f'"{{" {_sequence(rules, items, _lark_str(","))} "}}"')
    if kind == "array" and isinstance(s.get("items"), dict):
        item = _gemma_value(rules, s["items"])
        return rules.add(f'"[" ({item} ("," {item})*)? "]"')
    return _value(rules, s)


_GEMMA_QUOTE = '<|"|>'


def _json_tools_body(rules: _Rules, name: str, params: Any) -> str:
    """``{"name": ..., "arguments": ...}`` between newlines, after ``<tool_call>``
    (Hermes, Qwen 2.5/3, SmolLM3...; Llama's after ``<|python_tag|>``); its parser reads
    the body up to the end marker or EOS."""
    head = '\n{"name": ' + json.dumps(name) + ', "arguments": '
    return f"{_lark_str(head)} {_args(rules, params)} {_lark_str('}' + chr(10))}"


def _qwen3_coder_body(rules: _Rules, name: str, params: Any) -> str:
    """``<function=NAME>`` and one ``<parameter=KEY>`` block per argument between
    newlines, after ``<tool_call>`` (Qwen3-Coder's template); ``</tool_call>`` follows."""
    params_rule = _key_value_body(
        rules, _object(params), lambda k: (f"<parameter={k}>\n", "\n</parameter>\n"))
    return (f"{_lark_str(chr(10) + '<function=' + name + '>' + chr(10))} {params_rule} "
            f"{_lark_str('</function>' + chr(10))}")


def _glm47_body(rules: _Rules, name: str, params: Any) -> str:
    """``NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...`` after
    ``<tool_call>`` (GLM-4.7's template: no newlines between); ``</tool_call>`` follows."""
    params_rule = _key_value_body(
        rules, _object(params), lambda k: (f"<arg_key>{k}</arg_key><arg_value>", "</arg_value>"))
    return f"{_lark_str(name)} {params_rule}"


def _mistral_body(rules: _Rules, name: str, params: Any) -> str:
    """``NAME[ARGS]{...}`` after ``[TOOL_CALLS]`` (Mistral's v11+ tokenizers: Devstral,
    Magistral, Mistral Small 3.2); no end marker: EOS ends the calls."""
    return f"{_lark_str(name + '[ARGS]')} {_args(rules, params)}"


def _kimi_k2_body(rules: _Rules, name: str, params: Any, index: int = 0) -> str:
    """``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}
    <|tool_call_end|>`` inside ``<|tool_calls_section_begin|>`` (Kimi K2's template; the
    ``functions.NAME:IDX`` id is the call's id, IDX the call's ``index`` in the turn)."""
    head = f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>"
    return f"{_lark_str(head)} {_args(rules, params)} {_lark_str('<|tool_call_end|>')}"


def _gemma4_body(rules: _Rules, name: str, params: Any) -> str:
    """``call:NAME{key:value,...}`` in Gemma 4's value syntax after ``<|tool_call>``;
    ``<tool_call|>`` follows."""
    obj = _object(params)
    args = _gemma_value(rules, obj) if _properties(obj) else rules.add('"{}"')
    return f"{_lark_str('call:' + name)} {args}"


def _harmony_body(rules: _Rules, name: str, params: Any) -> str:
    """`` to=functions.`` (after ``<|start|>assistant<|channel|>commentary``... in the
    prompt: the format's start) + ``NAME<|channel|>commentary <|constrain|>json<|message|>
    {...}``, as gpt-oss's template renders a call; ``<|call|>`` is an EOS token and ends it."""
    head = f"{name}<|channel|>commentary <|constrain|>json<|message|>"
    return f"{_lark_str(head)} {_args(rules, params)}"


def _module_format(family: str) -> tuple[Callable[..., str], CallSequence] | None:
    """The call body and sequence of a format of ours whose module writes its own
    (``kit/formats/<family>.py``: ``grammar_body(name, args) -> Lark expression`` of one
    call, the arguments one JSON object, e.g. DeepSeek's V3.1 form, and
    ``GRAMMAR_BETWEEN`` / ``GRAMMAR_CLOSE``, :class:`CallSequence`'s fields), or None."""

    if not ours(family):
        return None
    import importlib

    module = importlib.import_module(f"kit.formats.{family}")
    body = getattr(module, "grammar_body", None)
    if body is None:
        return None
    sequence = CallSequence(getattr(module, "GRAMMAR_BETWEEN", None),
                            getattr(module, "GRAMMAR_CLOSE", ""))
    return (lambda rules, name, params: body(name, _args(rules, params))), sequence


def _object(params: Any) -> Any:
    return params if isinstance(params, dict) else {}


def _args(rules: _Rules, params: Any) -> str:
    """The arguments object as JSON (:func:`_json_rule` for a tool)."""
    return rules.add(json_rule(params, tool=True))


#: Lark grammar of one tool call's body per tool format (:attr:`kit.formats.OutputFormat.
#: grammar`, the tool format's name), given the rules to add to, one tool's name and its
#: parameters' JSON schema (and, for a :attr:`CallSequence.numbered` format, the call's
#: ``index`` in the turn); it returns the body's expression. The first body follows the
#: format's start marker, which the prompt ends with; :data:`CALL_SEQUENCES` says what
#: comes between bodies and after the last. A format of ours whose module has
#: ``grammar_body`` (DeepSeek's) is found there (:func:`_module_format`). Each follows the
#: call markup of the family's published chat template; tests/engine/test_grammar.py
#: parses calls each one allows with the format's own parser.
TOOL_CALL_BODIES: dict[str, Callable[..., str]] = {
    "json_tools": _json_tools_body, "llama3_json": _json_tools_body,
    "qwen3_coder": _qwen3_coder_body, "glm47": _glm47_body, "mistral": _mistral_body,
    "kimi_k2": _kimi_k2_body, "gemma4": _gemma4_body, "harmony": _harmony_body}


@dataclass(frozen=True)
class CallSequence:
    """How a format writes one or more calls in one turn, around the bodies of
    :data:`TOOL_CALL_BODIES`: ``body (between body)* close``.

    Attributes:
        between: the markup between two calls (the end of one, the start of the next, as
            the family's template renders a turn with several calls); None: one call per
            turn (gpt-oss ends a call with ``<|call|>``, an EOS token; Llama 3's templates
            refuse a turn with more than one call).
        close: the markup after the last call (the section's or the call's end).
        close_optional: the format's parser also reads a last call that EOS ends without
            ``close`` (json_tools), so the model may stop either way.
        numbered: each call's markup carries its index in the turn (Kimi's
            ``functions.NAME:IDX``): the bodies take ``index``, and a turn holds at most
            :data:`MAX_NUMBERED_CALLS` calls (a grammar cannot count without bound).
    """

    between: str | None
    close: str = ""
    close_optional: bool = False
    numbered: bool = False


#: The call sequences of the formats in :data:`TOOL_CALL_BODIES`, from each family's chat
#: template (how it renders an assistant turn with several ``tool_calls``) and read back by
#: its parser as several calls (tests/engine/test_grammar_parallel.py checks both).
CALL_SEQUENCES: dict[str, CallSequence] = {
    # Qwen3 / Hermes: "<tool_call>\n{...}\n</tool_call>" per call, "\n" between
    "json_tools": CallSequence("</tool_call>\n<tool_call>", "</tool_call>",
                               close_optional=True),
    "llama3_json": CallSequence(None),
    "qwen3_coder": CallSequence("</tool_call>\n<tool_call>", "</tool_call>"),
    "glm47": CallSequence("</tool_call><tool_call>", "</tool_call>"),  # nothing between
    "mistral": CallSequence("[TOOL_CALLS]"),  # "[TOOL_CALLS]NAME[ARGS]{...}" per call
    "kimi_k2": CallSequence("", "<|tool_calls_section_end|>", numbered=True),  # one section
    "gemma4": CallSequence("<tool_call|><|tool_call>", "<tool_call|>"),
    "harmony": CallSequence(None),
}

#: The most calls a forced turn of a numbered format (Kimi) may hold.
MAX_NUMBERED_CALLS = 16

#: JSON layout of constrained output: compact separators, no free whitespace (what models
#: write most often, and the fewest tokens).
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _lark_str(text: str) -> str:
    """A Lark string literal matching ``text`` exactly (JSON escaping, which llguidance's
    Lark accepts)."""
    return json.dumps(text)


def json_rule(schema: Any, *, tool: bool) -> str:
    """A ``%json`` Lark item for ``schema`` (also :func:`kit.engine.decode.grammar.json_grammar`'s).

    ``tool`` (a tool's arguments): objects that list ``properties`` and say nothing about
    ``additionalProperties`` get no other keys, and an object schema without properties
    (or none at all) means no arguments — a small model otherwise invents keys (e.g.
    copying ``description``) and never closes the object; keywords llguidance does not
    implement are ignored (``lenient``: agents send large schemas). For answers
    (``response_format``) such keywords are an error, never silently dropped.

    Raises:
        ValueError: ``schema`` is not a JSON object (or its ``x-guidance`` is not).
    """
    if schema is None and tool:
        schema = {}
    if not isinstance(schema, dict) or not isinstance(schema.get("x-guidance", {}), dict):
        raise ValueError("the schema must be a JSON object")
    schema = dict(schema)
    if tool and schema.get("type", "object") == "object" and "additionalProperties" not in \
            schema and not any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref")):
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        schema["additionalProperties"] = False
    if tool:
        schema = _closed(schema)
    schema["x-guidance"] = {**_JSON_OPTIONS, "lenient": tool, **schema.get("x-guidance", {})}
    return "%json " + json.dumps(schema)


def _closed(schema: Any) -> Any:
    """``schema`` with its nested objects that list ``properties`` (and say nothing of
    ``additionalProperties``) closed to other keys, as a tool's arguments are: a small
    model otherwise invents keys inside them until ``max_tokens``."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _closed(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if isinstance(out.get("items"), dict):
        out["items"] = _closed(out["items"])
    return out


def tool_call_grammar(family: str | None, tools: list[dict[str, Any]], *,
                      parallel: bool = False) -> str | None:
    """The Lark grammar of a forced turn's calls, each choosing among ``tools`` (OpenAI
    function schemas ``{"type": "function", "function": {"name", "parameters"}}``): one
    call, or with ``parallel`` one or more in the format's own sequence
    (:data:`CALL_SEQUENCES`; still one where the format takes one per turn), then the
    format's close and EOS. None when the body format of ``family`` (an mlx-lm
    tool-parser name) is not known.

    Raises:
        ValueError: a tool's parameters are not a JSON schema object, or are nested too
            deeply or list too many properties to build the grammar (the bodies recurse
            per property: a hostile schema must be a 400, not a crash).
    """
    try:
        return _tool_call_grammar(family, tools, parallel)
    except RecursionError:
        raise ValueError("the tool's schema is too deeply nested or has too many properties "
                         "to constrain a call to it") from None


def _tool_call_grammar(family: str | None, tools: list[dict[str, Any]],
                       parallel: bool) -> str | None:
    name = family or ""
    found = (TOOL_CALL_BODIES[name], CALL_SEQUENCES[name]) if name in TOOL_CALL_BODIES \
        else _module_format(name) if name else None
    if found is None or not tools:
        return None
    body, seq = found
    parallel = parallel and seq.between is not None
    count = MAX_NUMBERED_CALLS if parallel and seq.numbered else 1
    lines, alts = [], [[] for _ in range(count)]  # alts[k]: call k's alternatives
    for i, tool in enumerate(tools):
        fn = tool.get("function") or {}
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ValueError("the schema must be a JSON object")
        rules = _Rules(f"t{i}")
        for k in range(count):
            alts[k].append(body(rules, str(fn.get("name", "")), params, index=k)
                           if seq.numbered else body(rules, str(fn.get("name", "")), params))
        lines += rules.lines
    calls = [f"call_{k}: " + " | ".join(a) for k, a in enumerate(alts)]
    close = f"{_lark_str(seq.close)}{'?' if seq.close_optional else ''}" if seq.close \
        else ""
    between = f"{_lark_str(seq.between)} " if seq.between else ""
    if not parallel:
        start = f"call_0 {close}"
    elif not seq.numbered:
        start = f"call_0 ({between}call_0)* {close}"
    else:  # call k is call_k: more_k is "" or the next call and what may follow it
        start = f"call_0 more_1 {close}"
        calls += [f'more_{k}: "" | {between}call_{k} more_{k + 1}'
                  for k in range(1, count)] + [f'more_{count}: ""']
    return "start: " + start.strip() + "\n" + "\n".join(calls + lines) + "\n"
