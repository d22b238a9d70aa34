"""JSON with comments (Zed's settings.json and the like), edited in place: set or delete one
value by its key path and leave every other byte of the file as it was — comments, trailing
commas, blank lines, key order, indentation, quoting.

Parsing is json-five's (JSONC is a subset of JSON5): its model loader tells where each key
and value starts and ends, its tokenizer where each comment, comma and run of whitespace
does. json-five round-trips a file unchanged, but it has no way to add or remove a member
that keeps the separators and the indentation right (its dumper writes back whatever
whitespace the model holds, and its modelizer quotes strings the Python way, which is not
JSON). So the edits themselves are ours, kept minimal: each one splices the text at the
offsets json-five reports, in the manner of VS Code's jsonc-parser ``modify``:

- a new member goes after the last one, on its own line at its siblings' indentation
  (after a comment that ends the previous line, never inside it), with a comma added to the
  previous member — or, when the container uses trailing commas, after that comma and with
  one of its own; an inline container (``{"a": 1}``) gets an inline member;
- a member is deleted with the whitespace that leads to it and the comma that separates
  it, so inserting then deleting gives the original bytes back;
- a replaced value is written at the indentation of its key.

Values are written with :func:`json.dumps` (so any string is a valid JSON string), and every
edit is checked by parsing the result again. The Python view (:func:`load`) is a
``dict``/``list`` whose item assignment and deletion (and ``append``, ``pop``...) perform
these edits; :func:`dump` returns the edited text.
"""

from __future__ import annotations

import bisect
import json
import re
from typing import Any, Iterable

from kit.errors import HarnessError

__all__ = ["JsoncDocument", "JsoncList", "JsoncObject", "dump", "load"]

_TRIVIA = frozenset({"WHITESPACE", "LINE_COMMENT", "BLOCK_COMMENT"})
_DEFAULT_UNIT = "  "


def _error_line(e: Exception) -> str:
    """The informative line of a json-five error (its first line is often a preamble)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for line in lines:
        if " at: " in line or "Illegal character" in line:
            return line
    return lines[0] if lines else type(e).__name__


def _plain(value: Any) -> Any:
    """A view (or any nested dict/list) as plain Python data."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
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


def _loads(text: str) -> Any:
    import json5

    return _decoded(json5.loads(text))


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
            raise ValueError(_error_line(e)) from None
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
        while j < len(self.toks) and self.toks[j].type in _TRIVIA:
            j += 1
        return j

    def previous_significant(self, i: int) -> int:
        j = i - 1
        while j >= 0 and self.toks[j].type in _TRIVIA:
            j -= 1
        return j

    def line_end(self, pos: int) -> int:
        """Where the comments that follow ``pos`` on its own line end (``pos`` if none):
        the place to start a new line after it without putting code inside a comment."""
        end, j = pos, self.at(pos)
        while j < len(self.toks):
            tok = self.toks[j]
            if tok.type not in _TRIVIA or (tok.type != "LINE_COMMENT" and "\n" in tok.value):
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
        _Parsed(text)  # raises ValueError when it does not parse

    # --- edits ----------------------------------------------------------------------------
    def set(self, path: list[Any], value: Any) -> None:
        """Set the value at ``path`` (a key of an object, or an index of an array, where
        ``len`` appends), replacing the value there or adding a member."""
        p = _Parsed(self.text)
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
        p = _Parsed(self.text)
        container, member = p.find(path)
        if member is None:
            raise KeyError(path)
        while member is not None:
            self.text = _splice(self.text, self._remove(p, container, member))
            p = _Parsed(self.text)
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
            data = _loads(new)
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
    def root(self) -> Any:
        """The document's value as a view whose edits change this document."""
        return _wrap(self, [], _loads(self.text))


def _wrap(doc: JsoncDocument, path: list[Any], value: Any) -> Any:
    if isinstance(value, dict):
        return JsoncObject(doc, path, value)
    if isinstance(value, list):
        return JsoncList(doc, path, value)
    return value


class JsoncObject(dict):
    """A JSON object of a :class:`JsoncDocument`: setting or deleting a key edits the text
    (nested objects and arrays are views too). ``copy()`` gives a plain dict."""

    def __init__(self, doc: JsoncDocument, path: list[Any], items: dict) -> None:
        super().__init__()
        self._doc, self._path = doc, path
        for key, value in items.items():
            super().__setitem__(key, _wrap(doc, path + [key], value))

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError("JSON object keys are strings")
        value = _plain(value)
        self._doc.set(self._path + [key], value)
        super().__setitem__(key, _wrap(self._doc, self._path + [key], value))

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._doc.delete(self._path + [key])
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            value = _plain(self[key])
            del self[key]
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self) -> tuple[str, Any]:
        if not self:
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(self))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> "JsoncObject":
        self.update(other)
        return self

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def copy(self) -> dict:
        return _plain(self)

    def __copy__(self) -> dict:
        return _plain(self)

    def __deepcopy__(self, memo: dict) -> dict:
        return _plain(self)

    def __reduce__(self):  # pickles as the plain dict it holds
        return dict, (_plain(self),)


class JsoncList(list):
    """A JSON array of a :class:`JsoncDocument`: item assignment, deletion, ``append``,
    ``extend`` and ``pop`` edit the text; reordering operations are not supported."""

    def __init__(self, doc: JsoncDocument, path: list[Any], items: list) -> None:
        super().__init__(_wrap(doc, path + [i], v) for i, v in enumerate(items))
        self._doc, self._path = doc, path

    def _index(self, index: Any) -> int:
        if not isinstance(index, int):
            raise TypeError("JSONC arrays are edited one index at a time")
        if not -len(self) <= index < len(self):
            raise IndexError("list index out of range")
        return index % len(self)

    def _rewrap(self) -> None:
        for i, value in enumerate(self):
            super().__setitem__(i, _wrap(self._doc, self._path + [i], _plain(value)))

    def __setitem__(self, index: Any, value: Any) -> None:
        i = self._index(index)
        value = _plain(value)
        self._doc.set(self._path + [i], value)
        super().__setitem__(i, _wrap(self._doc, self._path + [i], value))

    def __delitem__(self, index: Any) -> None:
        i = self._index(index)
        self._doc.delete(self._path + [i])
        super().__delitem__(i)
        self._rewrap()

    def append(self, value: Any) -> None:
        value = _plain(value)
        self._doc.set(self._path + [len(self)], value)
        super().append(_wrap(self._doc, self._path + [len(self)], value))

    def extend(self, values: Iterable[Any]) -> None:
        for value in values:
            self.append(value)

    def __iadd__(self, values: Iterable[Any]) -> "JsoncList":
        self.extend(values)
        return self

    def pop(self, index: int = -1) -> Any:
        i = self._index(index)
        value = _plain(self[i])
        del self[i]
        return value

    def remove(self, value: Any) -> None:
        del self[self.index(value)]

    def clear(self) -> None:
        while self:
            del self[-1]

    def _unsupported(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("reordering a JSONC array in place is not supported")

    insert = sort = reverse = __imul__ = _unsupported

    def copy(self) -> list:
        return _plain(self)

    def __copy__(self) -> list:
        return _plain(self)

    def __deepcopy__(self, memo: dict) -> list:
        return _plain(self)

    def __reduce__(self):
        return list, (_plain(self),)


def load(text: str) -> Any:
    """Parse JSONC ``text`` into an editable view (:class:`JsoncObject` or
    :class:`JsoncList`; a scalar root comes back as plain data). A text that holds only
    comments is an empty object placed after them.

    Raises:
        ValueError: the text is not JSONC (the message names the place).
    """
    from json5.tokenizer import tokenize

    try:
        only_trivia = all(t.type in _TRIVIA for t in tokenize(text))
    except Exception as e:  # noqa: BLE001 - the tokenizer's own error types
        raise ValueError(_error_line(e)) from None
    if only_trivia:
        text = text + ("" if not text or text.endswith("\n") else "\n") + "{}\n"
    return JsoncDocument(text).root()


def dump(view: Any) -> str:
    """The text of the document ``view`` belongs to."""
    if not isinstance(view, (JsoncObject, JsoncList)):
        raise TypeError("not a view of a JSONC document")
    return view._doc.text
