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

from typing import Any, Iterable

from kit.harness.jsonc_text import TRIVIA, JsoncDocument, error_line, loads, plain

__all__ = ["JsoncDocument", "JsoncList", "JsoncObject", "dump", "load"]


def _root(doc: JsoncDocument) -> Any:
    """The document's value as a view whose edits change ``doc``."""
    return _wrap(doc, [], loads(doc.text))


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
        value = plain(value)
        self._doc.set(self._path + [key], value)
        super().__setitem__(key, _wrap(self._doc, self._path + [key], value))

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._doc.delete(self._path + [key])
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            value = plain(self[key])
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
        return plain(self)

    def __copy__(self) -> dict:
        return plain(self)

    def __deepcopy__(self, memo: dict) -> dict:
        return plain(self)

    def __reduce__(self):  # pickles as the plain dict it holds
        return dict, (plain(self),)


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
            super().__setitem__(i, _wrap(self._doc, self._path + [i], plain(value)))

    def __setitem__(self, index: Any, value: Any) -> None:
        i = self._index(index)
        value = plain(value)
        self._doc.set(self._path + [i], value)
        super().__setitem__(i, _wrap(self._doc, self._path + [i], value))

    def __delitem__(self, index: Any) -> None:
        i = self._index(index)
        self._doc.delete(self._path + [i])
        super().__delitem__(i)
        self._rewrap()

    def append(self, value: Any) -> None:
        value = plain(value)
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
        value = plain(self[i])
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
        return plain(self)

    def __copy__(self) -> list:
        return plain(self)

    def __deepcopy__(self, memo: dict) -> list:
        return plain(self)

    def __reduce__(self):
        return list, (plain(self),)


def load(text: str) -> Any:
    """Parse JSONC ``text`` into an editable view (:class:`JsoncObject` or
    :class:`JsoncList`; a scalar root comes back as plain data). A text that holds only
    comments is an empty object placed after them.

    Raises:
        ValueError: the text is not JSONC (the message names the place).
    """
    from json5.tokenizer import tokenize

    try:
        only_trivia = all(t.type in TRIVIA for t in tokenize(text))
    except Exception as e:  # noqa: BLE001 - the tokenizer's own error types
        raise ValueError(error_line(e)) from None
    if only_trivia:
        text = text + ("" if not text or text.endswith("\n") else "\n") + "{}\n"
    return _root(JsoncDocument(text))


def dump(view: Any) -> str:
    """The text of the document ``view`` belongs to."""
    if not isinstance(view, (JsoncObject, JsoncList)):
        raise TypeError("not a view of a JSONC document")
    return view._doc.text
