"""Reading the calls of one DeepSeek block (see :mod:`kit.formats.deepseek`, the format's
entry point): V3/V3.1 calls with JSON arguments, DSML invokes with raw-text or JSON
parameters. Our own: no maintained library parses these formats (see the entry point).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kit.formats._deepseek_markup import (
    BLOCKS,
    CALL_BEGIN,
    CALL_END,
    CALLS_END,
    DSML,
    PARAM_CLOSE,
    SEP,
    WS,
)

_INVOKE = re.compile(f"<{DSML} ?invoke(?![A-Za-z_])")
_INVOKE_CLOSE = re.compile(f"</{DSML} ?invoke>")
_PARAM = re.compile(f"<{DSML} ?parameter(?![A-Za-z_])")
_BLOCK_CLOSE = re.compile(f"</{DSML} ?(?:{'|'.join(BLOCKS)})>\\s*$")
_ATTR = re.compile(r'\s*([A-Za-z_][\w-]*)="([^"]*)"')


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def _schema_type(tools: Any, name: str, key: str) -> Any:
    """The JSON-schema ``type`` of argument ``key`` of tool ``name`` in the request's
    ``tools`` (OpenAI function schemas), or None when the schema does not say."""
    for tool in tools if isinstance(tools, list) else ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            prop = props.get(key) if isinstance(props, dict) else None
            return prop.get("type") if isinstance(prop, dict) else None
    return None


def _v3_calls(text: str, calls: list[dict]) -> None:
    """Appends the V3/V3.1 calls of ``text`` (a block's body) to ``calls``, in order.

    Raises:
        ValueError: the body is not a sequence of well-formed calls (or is cut).
    """
    i, n = 0, len(text)
    while (i := _skip_ws(text, i)) < n:
        if not text.startswith(CALL_BEGIN, i):
            raise ValueError(f"expected {CALL_BEGIN} at {i}")
        sep = text.find(SEP, i)
        if sep < 0:
            raise ValueError(f"no {SEP}")
        head, j = text[i + len(CALL_BEGIN):sep], sep + len(SEP)
        k = _skip_ws(text, j)
        fenced = k >= n or text[k] != "{"
        if not fenced:  # V3.1: NAME<sep>{ARGS}
            name = head
        else:  # V3: TYPE<sep>NAME\n```json\n{ARGS}\n```
            nl = text.find("\n", j)
            if nl < 0:
                raise ValueError("no newline after the name")
            name, k = text[j:nl], _skip_ws(text, nl)
            for fence in ("```json", "```"):
                if text.startswith(fence, k):
                    k = _skip_ws(text, k + len(fence))
                    break
        args, k = _JSON.raw_decode(text, k)
        if not isinstance(args, dict):
            raise ValueError("the arguments are not a JSON object")
        k = _skip_ws(text, k)
        if fenced and text.startswith("```", k):
            k = _skip_ws(text, k + 3)
        if not text.startswith(CALL_END, k) or not name.strip():
            raise ValueError(f"expected {CALL_END} at {k}")
        calls.append({"name": name.strip(), "arguments": args})
        i = k + len(CALL_END)


def _attrs(text: str, i: int) -> tuple[dict[str, str], int, bool]:
    """A tag's ``key="value"`` attributes from ``i``; returns them, the index past the tag
    and whether it closed itself (``/>``).

    Raises:
        ValueError: malformed or cut attributes.
    """
    attrs: dict[str, str] = {}
    while True:
        i = _skip_ws(text, i)
        if text.startswith("/>", i):
            return attrs, i + 2, True
        if text.startswith(">", i):
            return attrs, i + 1, False
        m = _ATTR.match(text, i)
        if m is None:
            raise ValueError(f"malformed tag attributes at {i}")
        attrs[m.group(1)] = m.group(2)
        i = m.end()


def _value(raw: str, string: str | None, declared: Any) -> Any:
    """A DSML parameter's value: ``string="true"`` raw text, ``string="false"`` JSON. Where
    the model broke that rule, the tool's schema decides, and only as far as it says: a
    value the schema declares a string stays raw text; without the attribute, a value the
    schema declares another type is read as JSON.

    Raises:
        ValueError: a value that must be JSON is not.
    """
    is_str = declared == "string"
    if string == "true" or (string is None and (is_str or declared is None)):
        return raw
    try:
        return _JSON.decode(raw)
    except ValueError:
        if is_str or string is None:
            return raw
        raise


def _dsml_calls(text: str, tools: Any, calls: list[dict]) -> None:
    """Appends the invokes of a DSML block body to ``calls``, in order.

    Raises:
        ValueError: not a sequence of well-formed invokes (or cut).
    """
    i, n = 0, len(text)
    while (i := _skip_ws(text, i)) < n:
        m = _INVOKE.match(text, i)
        if m is None:
            raise ValueError(f"expected an invoke at {i}")
        attrs, i, closed = _attrs(text, m.end())
        name = attrs.get("name", "").strip()
        if not name:
            raise ValueError("an invoke without a name")
        args: dict[str, Any] = {}
        while not closed:
            i = _skip_ws(text, i)
            if (end := _INVOKE_CLOSE.match(text, i)) is not None:
                i, closed = end.end(), True
                continue
            if (p := _PARAM.match(text, i)) is None:
                raise ValueError(f"expected a parameter or the invoke's end at {i}")
            pattrs, i, empty = _attrs(text, p.end())
            key = pattrs.get("name")
            if key is None or key in args:
                raise ValueError(f"a parameter without a name, or twice: {key!r}")
            raw = ""
            if not empty:
                if (close := PARAM_CLOSE.search(text, i)) is None:
                    raise ValueError(f"parameter {key!r} is not closed")
                raw, i = text[i:close.start()], close.end()
            args[key] = _value(raw, pattrs.get("string"), _schema_type(tools, name, key))
        calls.append({"name": name, "arguments": args})


def _body(text: str) -> tuple[str, bool]:
    """A block's text without its closing marker, and whether it is DSML."""
    head = text.lstrip(WS)
    if head.startswith(f"<{DSML}") or head.startswith(f"</{DSML}"):
        m = _BLOCK_CLOSE.search(text)
        return (text[:m.start()] if m else text), True
    stripped = text.rstrip(WS)
    if stripped.endswith(CALLS_END):
        stripped = stripped[:-len(CALLS_END)]
    return stripped, False


def parse_tool_call(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The calls of one block (its text after the start marker, closing marker included
    or not): ``[{"name": str, "arguments": dict}, ...]`` in the order written.

    Raises:
        ValueError: the block is not well-formed or holds no call (the engine then
            returns it as text).
    """
    body, dsml = _body(text)
    calls: list[dict[str, Any]] = []
    (_dsml_calls(body, tools, calls) if dsml else _v3_calls(body, calls))
    if not calls:
        raise ValueError("no tool call in the block")
    return calls


def parse_partial(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The complete calls of a block cut off by ``max_tokens`` (each up to its own end
    marker), in order; [] when none is complete."""
    body, dsml = _body(text)
    calls: list[dict[str, Any]] = []
    try:
        (_dsml_calls(body, tools, calls) if dsml else _v3_calls(body, calls))
    except ValueError:
        pass  # the cut call: only those before it are complete
    return calls
