"""Round-trip loading and dumping of users' config files, per format, keeping comments,
key order and formatting where the format allows: ruamel.yaml for YAML, tomlkit for TOML,
the json module for plain JSON (which has no comments; key order and 2-space indentation
are kept), and :mod:`kit.harness.jsonc` for JSON with comments and trailing commas (every
byte outside the values we set stays as it was)."""

from __future__ import annotations

import functools
import io
import json
from typing import Any

from kit.errors import HarnessError
from kit.harness import jsonc

FORMATS = ("yaml", "toml", "json", "jsonc")


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip mode: comments, order, anchors kept
    yaml.Representer = _yaml_representer()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-fold the user's long lines
    return yaml


@functools.cache
def _yaml_representer() -> type:
    """ruamel's round-trip representer, but a string holding U+0085 (NEL) is written
    double-quoted (``\\N``): ruamel picks single quotes for it, where NEL is a line break
    and reads back as a space (a value of the user's we put back would change)."""
    from ruamel.yaml.representer import RoundTripRepresenter

    class Representer(RoundTripRepresenter):
        pass

    def represent_str(representer: Any, data: str) -> Any:
        if "\x85" in data:
            return representer.represent_scalar("tag:yaml.org,2002:str", data, style='"')
        return RoundTripRepresenter.represent_str(representer, data)

    Representer.add_representer(str, represent_str)
    return Representer


def loads(fmt: str, text: str, where: str) -> Any:
    """Parse ``text`` (empty text is an empty document).

    Raises:
        HarnessError: the file is not valid ``fmt`` (nothing is written then).
    """
    try:
        if fmt == "yaml":
            return _yaml().load(text) if text.strip() else None
        if fmt == "toml":
            import tomlkit

            return tomlkit.parse(text)
        if fmt == "json":
            return json.loads(text) if text.strip() else None
        if fmt == "jsonc":
            return jsonc.load(text) if text.strip() else None
    except Exception as e:  # each parser has its own error types
        raise HarnessError(f"{where} is not valid {fmt.upper()}: {str(e).splitlines()[0]}",
                           hint="fix the file (mlx-kit changes nothing until it parses)") from None
    raise HarnessError(f"unknown config format {fmt!r}")


def dumps(fmt: str, data: Any) -> str:
    if fmt == "yaml":
        out = io.StringIO()
        _yaml().dump(data, out)
        return out.getvalue()
    if fmt == "toml":
        import tomlkit

        return tomlkit.dumps(data)
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if fmt == "jsonc":
        return jsonc.dump(data)
    raise HarnessError(f"unknown config format {fmt!r}")


def empty(fmt: str, kind: str) -> Any:
    """An empty document whose top level is a ``list`` or a ``mapping``."""
    if fmt == "toml":
        import tomlkit

        return tomlkit.document()
    if fmt == "yaml":
        from ruamel.yaml.comments import CommentedMap, CommentedSeq

        return CommentedSeq() if kind == "list" else CommentedMap()
    if fmt == "jsonc":
        return jsonc.load("[]\n" if kind == "list" else "{}\n")
    return [] if kind == "list" else {}
