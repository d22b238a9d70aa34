"""One pydantic ValidationError of an agent spec -> one line for its author.

pydantic reports every problem with a location tuple and an English sentence written for
Python programmers ("Input should be a valid string"); a spec author wants the file, the
dotted TOML key and what to write instead: ``pi.toml: files[0].mode: must be 'drop-in' or
'merge' (got 'symlink')`` with ``hint:`` the field's own description (the one the JSON
schema publishes) or, for an unknown key, the keys that table takes. pydantic has no such
formatter, so this small one is ours.
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from kit.errors import HarnessError


class SpecValueError(ValueError):
    """A rule a validator checks: ``key`` (a location like pydantic's, ``("launch", "env",
    "VAR")``) when the rule is about another key than the one pydantic reports it at (a
    model validator's is its table), ``hint`` for the ``hint:`` line."""

    def __init__(self, message: str, key: tuple[str | int, ...] | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.hint = hint


#: What pydantic's error types mean in a TOML file.
_PHRASES = {
    "missing": "required key missing",
    "extra_forbidden": "unknown key",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "float_type": "must be a number",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "string_too_short": "must not be empty",
    "string_too_long": "too long (at most {max_length} characters)",
    "too_short": "needs at least {min_length} items",
    "too_long": "takes at most {max_length} items",
    "string_pattern_mismatch": "does not match {pattern}",
    "literal_error": "must be {expected}",
}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def dotted(loc: tuple[Any, ...]) -> str:
    """``("files", 0, "owns", 1)`` -> ``files[0].owns[1]``; a key that is not a bare TOML
    key is quoted (``launch.env."A B"``). pydantic's ``[key]`` step (the problem is the
    mapping's key itself, not its value) is left out: the key is what is named."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":
            key = part if _BARE_KEY.fullmatch(str(part)) else json.dumps(str(part))
            out += f".{key}" if out else key
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``tuple[M, ...]``, ``M | None``, ``Annotated[M, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _locate(root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None,
                                                                 FieldInfo | None]:
    """The table (model) and the field a location points into; (table, None) when its
    last key is not one of that table's fields."""
    model: type[BaseModel] | None = root
    field: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int):
            continue  # an index into a list of tables
        if model is None:
            return None, field  # a key inside a plain mapping (launch.env.VAR)
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        if part not in fields:
            return model, None
        field = fields[part]
        model = _model_of(field.annotation)
    return model, field


def _first_sentence(text: str | None) -> str | None:
    if not text:
        return None
    return re.split(r"\.\s+(?=[A-Z])", " ".join(text.split()))[0].rstrip(".")


def spec_error(root: type[BaseModel], error: ValidationError, where: str) -> HarnessError:
    """The first problem of ``error`` (raised validating ``root`` from the file ``where``)
    as a one-line :class:`HarnessError`: ``<where>: <dotted key>: <problem>``, hint
    included; ``(+N more)`` says how many other problems the file has."""
    # An unknown key first: a misspelt key also makes the real one "missing", and the
    # typo is what the author has to fix.
    errors = sorted(error.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc, kind, ctx = tuple(first["loc"]), first["type"], first.get("ctx") or {}
    cause = ctx.get("error")
    hint = None
    if isinstance(cause, SpecValueError):
        text, hint = str(cause), cause.hint
        loc = cause.key if cause.key is not None else loc
    elif kind in ("value_error", "assertion_error") and cause is not None:
        text = str(cause)
    else:
        text = _PHRASES.get(kind, first["msg"]).format(**ctx)
        if kind not in ("missing", "extra_forbidden"):
            shown = repr(first["input"])
            text += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    table, field = _locate(root, loc)
    if kind == "extra_forbidden" and table is not None:
        hint = "known keys here: " + ", ".join(f.alias or name for name, f in
                                               table.model_fields.items())
    elif hint is None and field is not None and loc and isinstance(loc[-1], str):
        hint = _first_sentence(field.description)
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    key = dotted(loc)
    return HarnessError(f"{where}: {key + ': ' if key else ''}{text}{more}", hint=hint)
