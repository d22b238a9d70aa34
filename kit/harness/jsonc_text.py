"""The text side of the JSONC editor (:mod:`kit.harness.jsonc`): json-five parses, and
:class:`JsoncDocument` sets or deletes one value by key path with minimal splices at the
offsets json-five reports, keeping every other byte (the rules are in jsonc.py's
docstring). Written here because no maintained pure-Python library edits JSONC in place
(jsonc-edit needs Node at run time; json5kit has no insert/delete)."""

from __future__ import annotations

import bisect
import copy
import functools
import json
import re
from typing import Any, Iterable

from kit.errors import HarnessError


#: json-five token types that are not part of the value (a file of only these is empty)
TRIVIA = frozenset({"WHITESPACE", "LINE_COMMENT", "BLOCK_COMMENT"})
_DEFAULT_UNIT = "  "


def error_line(e: Exception) -> str:
    """The informative line of a json-five error (its first line is often a preamble)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for line in lines:
        if " at: " in line or "Illegal character" in line:
            return line
    return lines[0] if lines else type(e).__name__


def plain(value: Any) -> Any:
    """A view (or any nested dict/list) as plain Python data."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _text(value: str) -> str:
    """A decoded string with its UTF-16 surrogate pairs joined: json-five decodes the escape
    ``\\ud83e\\udd99`` as two lone surrogates, where JSON means one character."""
    return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _decoded(value: Any) -> Any:
    """json-five's Python value of a document, strings fixed by :func:`_text`."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_text(str(k)): _decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


def loads(text: str) -> Any:
    """``text`` as plain Python data (json-five's parse, surrogate pairs joined); a fresh
    copy each call, so callers may change it.

    Raises:
        ValueError: the text is not JSON5 (json-five's error types derive from it).
    """
    return copy.deepcopy(_loads_cached(text))


# json-five parses in pure Python (~8 ms for a small settings file) and one install or
# removal parses the same few texts dozens of times (check, edit, re-check); the results
# are read-only, so the last few are kept.
@functools.lru_cache(maxsize=16)
def _loads_cached(text: str) -> Any:
    import json5

    return _decoded(json5.loads(text))


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> "_Parsed":
    """:class:`_Parsed` of ``text``, shared: its model and tokens are only read."""
    return _Parsed(text)


def _line_indent(text: str, pos: int) -> str:
    """The leading spaces/tabs of the line that holds ``pos``."""
    start = text.rfind("\n", 0, pos) + 1
    return re.match(r"[ \t]*", text[start:]).group()


def _starts_line(text: str, pos: int) -> bool:
    return not text[text.rfind("\n", 0, pos) + 1:pos].strip()


def _newline(text: str) -> str:
    """The file's line ending: CRLF when it has one, else LF."""
    return "\r\n" if "\r\n" in text else "\n"


def _render(value: Any, indent: str, unit: str, inline: bool, nl: str = "\n") -> str:
    """``value`` as JSON: one line for an inline container, else indented by ``unit`` below
    a first line that starts at ``indent``, lines ending in ``nl``. U+2028/2029 are escaped
    (valid JSON either way, but some tools treat them as line breaks)."""
    if inline:
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    else:
        text = json.dumps(value, ensure_ascii=False, indent=unit).replace("\n", nl + indent)
    # U+2028/2029 and any lone surrogate, escaped (a lone one cannot even be written as UTF-8)
    return re.sub("[\u2028\u2029\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", text)


class _Member:
    """One member of a container: ``key`` (None in an array), where it starts (its key, or
    its value in an array) and ends (its value's last character), and its value node."""

    __slots__ = ("key", "start", "end", "node")

    def __init__(self, key: str | None, start: int, end: int, node: Any) -> None:
        self.key, self.start, self.end, self.node = key, start, end, node


class _Parsed:
    """One parse of a text: json-five's model of it and its token stream (the tokens cover
    the text end to end, trivia included)."""

    def __init__(self, text: str) -> None:
        import json5
        from json5.loader import ModelLoader
        from json5.tokenizer import tokenize

        try:
            self.root = json5.loads(text, loader=ModelLoader()).value
            self.toks = list(tokenize(text))
        except Exception as e:  # json-five raises its own error types (and sly's)
            raise ValueError(error_line(e)) from None
        self.text = text
        self.starts = [t.index for t in self.toks]

    # --- tokens ---------------------------------------------------------------------------
    def at(self, pos: int) -> int:
        """The index of the token that starts at ``pos`` (len(toks) at the end of text)."""
        i = bisect.bisect_left(self.starts, pos)
        if i < len(self.starts) and self.starts[i] != pos:
            raise AssertionError(f"no token starts at {pos}")
        return i

    def next_significant(self, i: int) -> int:
        """The first token after index ``i`` that is not whitespace or a comment."""
        j = i + 1
        while j < len(self.toks) and self.toks[j].type in TRIVIA:
            j += 1
        return j

    def previous_significant(self, i: int) -> int:
        j = i - 1
        while j >= 0 and self.toks[j].type in TRIVIA:
            j -= 1
        return j

    def line_end(self, pos: int) -> int:
        """Where the comments that follow ``pos`` on its own line end (``pos`` if none):
        the place to start a new line after it without putting code inside a comment."""
        end, j = pos, self.at(pos)
        while j < len(self.toks):
            tok = self.toks[j]
            if tok.type not in TRIVIA or (tok.type != "LINE_COMMENT" and "\n" in tok.value):
                break
            if tok.type != "WHITESPACE":
                end = tok.end
                if tok.type == "LINE_COMMENT":
                    break
            j += 1
        return end

    # --- structure ------------------------------------------------------------------------
    @staticmethod
    def span(node: Any) -> tuple[int, int]:
        return node._tok.index, (node._end_tok or node._tok).end

    @staticmethod
    def key_name(key: Any) -> str:
        return _text(str(key.characters if hasattr(key, "characters") else key.name))

    def members(self, node: Any) -> list[_Member]:
        from json5.model import JSONObject

        if isinstance(node, JSONObject):
            return [_Member(self.key_name(k), k._tok.index, self.span(v)[1], v)
                    for k, v in node.key_value_pairs]
        return [_Member(None, *self.span(v), v) for v in node.values]

    def find(self, path: list[Any]) -> tuple[Any, _Member | None]:
        """The container that holds ``path``'s last part, and that member (None when it
        does not exist; for duplicate keys, the last one, which is the one that counts).

        Raises:
            KeyError: a part above the last one is missing or is not a container.
        """
        from json5.model import JSONArray, JSONObject

        node, member = self.root, None
        for depth, part in enumerate(path):
            if not isinstance(node, (JSONObject, JSONArray)):
                raise KeyError(path[:depth])
            members = self.members(node)
            if isinstance(node, JSONObject):
                found = [m for m in members if m.key == part]
                member = found[-1] if found else None
            else:
                member = members[part] if isinstance(part, int) and -len(members) <= part \
                    < len(members) else None
            if depth == len(path) - 1:
                return node, member
            if member is None:
                raise KeyError(path[:depth + 1])
            node = member.node
        raise KeyError(path)

    def unit(self) -> str:
        """The file's indentation step: that of the root's first member when it starts a
        line, else two spaces."""
        from json5.model import JSONArray, JSONObject

        if isinstance(self.root, (JSONObject, JSONArray)):
            members = self.members(self.root)
            if members and _starts_line(self.text, members[0].start):
                indent = _line_indent(self.text, members[0].start)
                base = _line_indent(self.text, self.span(self.root)[0])
                if indent.startswith(base) and len(indent) > len(base):
                    return indent[len(base):]
        return _DEFAULT_UNIT

    def inline(self, container: Any) -> bool:
        """Whether a container is written on one line (``{"a": 1}``)."""
        start, end = self.span(container)
        members = self.members(container)
        first = members[0].start if members else end - 1
        return "\n" not in self.text[start:first]


def _splice(text: str, edits: Iterable[tuple[int, int, str]]) -> str:
    """Apply non-overlapping ``(start, end, new text)`` edits; insertions at the same
    offset land in the order given."""
    ordered = sorted(enumerate(edits), key=lambda e: (e[1][0], e[0]), reverse=True)
    for _, (start, end, new) in ordered:
        text = text[:start] + new + text[end:]
    return text


class JsoncDocument:
    """A JSONC text and the edits made to it. ``text`` is always the current file."""

    def __init__(self, text: str) -> None:
        self.text = text
        _parsed(text)  # raises ValueError when it does not parse

    # --- edits ----------------------------------------------------------------------------
    def set(self, path: list[Any], value: Any) -> None:
        """Set the value at ``path`` (a key of an object, or an index of an array, where
        ``len`` appends), replacing the value there or adding a member."""
        p = _parsed(self.text)
        container, member = p.find(path)
        unit = p.unit()
        if member is not None:
            indent = _line_indent(self.text, member.start)
            start, end = p.span(member.node)
            self._commit([(start, end, _render(value, indent, unit, p.inline(container),
                                               _newline(self.text)))], path, value)
            return
        from json5.model import JSONArray

        if isinstance(container, JSONArray) and path[-1] != len(p.members(container)):
            raise IndexError(f"index {path[-1]} out of range")
        self._commit(self._insert(p, container, None if isinstance(container, JSONArray)
                                  else path[-1], value, unit), path, value)

    def delete(self, path: list[Any]) -> None:
        """Delete the member at ``path`` (every member with that key, for duplicates).

        Raises:
            KeyError: there is no such member.
        """
        p = _parsed(self.text)
        container, member = p.find(path)
        if member is None:
            raise KeyError(path)
        while member is not None:
            self.text = _splice(self.text, self._remove(p, container, member))
            p = _parsed(self.text)
            container, member = p.find(path) if isinstance(path[-1], str) else (None, None)

    # --- the splices ----------------------------------------------------------------------
    @staticmethod
    def _insert(p: _Parsed, container: Any, key: str | None, value: Any,
                unit: str) -> list[tuple[int, int, str]]:
        text, nl = p.text, _newline(p.text)
        open_, close = p.span(container)[0], p.span(container)[1] - 1
        prefix = "" if key is None else _render(key, "", unit, True) + ": "
        members = p.members(container)
        if members and p.inline(container):
            body = prefix + _render(value, "", unit, inline=True)
            after = p.next_significant(p.at(members[-1].end) - 1)
            if p.toks[after].type == "COMMA":  # keep the trailing comma style
                return [(p.toks[after].end, p.toks[after].end, " " + body + ",")]
            return [(members[-1].end, members[-1].end, ", " + body)]
        if members:
            first = members[0].start
            indent = _line_indent(text, first) if _starts_line(text, first) \
                else _line_indent(text, open_) + unit
            body = prefix + _render(value, indent, unit, False, nl)
            last = members[-1]
            after = p.next_significant(p.at(last.end) - 1)
            if p.toks[after].type == "COMMA":  # trailing comma: ours goes after it, with one
                at = p.line_end(p.toks[after].end)
                return [(at, at, nl + indent + body + ",")]
            at = p.line_end(last.end)
            return [(last.end, last.end, ","), (at, at, nl + indent + body)]
        # an empty container
        outer = _line_indent(text, open_)
        indent = outer + unit
        body = prefix + _render(value, indent, unit, False, nl)
        inner = p.toks[p.at(open_) + 1:p.at(close)]
        breaks = [t for t in inner if t.type == "WHITESPACE" and "\n" in t.value]
        if breaks:  # "{\n}", "{\n  // note\n}": a line of its own before the closing one
            at = breaks[-1].value.rfind("\n")
            at = breaks[-1].index + (at - 1 if breaks[-1].value[at - 1:at] == "\r" else at)
            return [(at, at, nl + indent + body)]
        if all(t.type == "WHITESPACE" for t in inner):  # "{}", "{ }"
            return [(open_ + 1, close, nl + indent + body + nl + outer)]
        return [(close, close, nl + indent + body + nl + outer)]  # "{/* x */}"

    @staticmethod
    def _remove(p: _Parsed, container: Any, member: _Member) -> list[tuple[int, int, str]]:
        first = p.at(member.start)
        before = p.toks[first - 1] if first > 0 else None
        start = before.index if before is not None and before.type == "WHITESPACE" \
            else member.start
        after = p.next_significant(p.at(member.end) - 1)
        if p.toks[after].type == "COMMA":  # a member followed by its comma
            return [(start, p.toks[after].end, "")]
        previous = p.previous_significant(first)
        if p.toks[previous].type == "COMMA":  # the last member: drop the comma before it
            return [(p.toks[previous].index, p.toks[previous].end, ""), (start, member.end, "")]
        # the only member: an empty container, "{}" when nothing else is left inside
        open_, end = p.span(container)
        rest = p.text[open_ + 1:start] + p.text[member.end:end - 1]
        if not rest.strip():
            return [(open_ + 1, end - 1, "")]
        return [(start, member.end, "")]

    def _commit(self, edits: list[tuple[int, int, str]], path: list[Any], value: Any) -> None:
        """Apply ``edits`` and check that the result parses and holds ``value`` at
        ``path`` (an editing bug must never write a broken file)."""
        new = _splice(self.text, edits)
        try:
            data = loads(new)
            for part in path:
                data = data[part]
            ok = json.dumps(data, sort_keys=True) == json.dumps(value, sort_keys=True)
        except Exception:  # noqa: BLE001 - any failure here is the same internal error
            ok = False
        if not ok:
            raise HarnessError("internal error: editing the JSONC file went wrong",
                               hint="please report it; nothing was written")
        self.text = new

    # --- the Python view ------------------------------------------------------------------
