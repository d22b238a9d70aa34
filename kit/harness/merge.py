"""Merging our entries into a config file the user shares with us, and taking them out
again — by keys, not bytes (agents may rewrite their files).

Two strategies, chosen per file in the agent's spec:

- ``list-by-key``: the document is a list of entries identified by ``key`` (llm's
  extra-openai-models.yaml, by ``model_id``); ours replace entries with the same key or are
  appended, and removal deletes exactly those entries.
- ``keys``: the document is a mapping; we own the dotted paths in ``owns`` (e.g.
  ``provider.mlx-kit``) and set them to what the template rendered; removal deletes them.

Every other entry, key, comment and the order of the file stay as they were (round-trip
parsers, :mod:`kit.harness.formats`). The manifest records a hash of each value we wrote,
so removal can tell when the user edited one of our entries.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from kit.errors import HarnessError
from kit.harness.formats import dumps, empty, loads


@dataclass(frozen=True)
class MergeSpec:
    """How our fragment goes into a shared file (see the module docstring)."""

    format: str
    strategy: str
    key: str | None = None
    owns: tuple[str, ...] = ()


def _plain(value: Any) -> Any:
    unwrap = getattr(value, "unwrap", None)  # tomlkit items
    if callable(unwrap):
        value = unwrap()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def fingerprint(value: Any) -> str:
    """A hash of a value's content, independent of formatting and comments."""
    text = json.dumps(_plain(value), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _path(dotted: str) -> list[str]:
    return dotted.split(".")


def _get(doc: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def merge(spec: MergeSpec, current: str | None, ours: str, where: str) -> tuple[str, dict]:
    """Merge the rendered fragment ``ours`` into ``current`` (None: no file yet).

    Returns:
        (the new file text, the record of what we own: ``{"entries": {id: fingerprint},
        "created": [parent paths we added], "previous": {id: the user's value we
        replaced}}``)

    Raises:
        HarnessError: the file does not parse, or its shape is not what the agent uses.
    """
    fragment = loads(spec.format, ours, f"{where} (rendered)")
    kind = "list" if spec.strategy == "list-by-key" else "mapping"
    doc = loads(spec.format, current or "", where) if current is not None else None
    if doc is None:
        doc = empty(spec.format, kind)
    owned: dict[str, str] = {}
    created: list[str] = []  # parent tables we had to add (removal drops them if empty)
    previous: dict[str, Any] = {}  # the user's values we replaced (removal puts them back)
    if spec.strategy == "list-by-key":
        if not isinstance(doc, list):
            raise HarnessError(f"{where} should hold a list of entries; it does not")
        for entry in fragment or []:
            ident = str(entry[spec.key])
            at = next((i for i, e in enumerate(doc)
                       if isinstance(e, dict) and str(e.get(spec.key)) == ident), None)
            if at is None:
                doc.append(entry)
            else:
                previous.setdefault(ident, _plain(doc[at]))
                doc[at] = entry
            owned[ident] = fingerprint(entry)
    else:
        if not isinstance(doc, dict):
            raise HarnessError(f"{where} should hold a mapping; it does not")
        for dotted in spec.owns:
            path = _path(dotted)
            value = _get(fragment, path)
            if value is None:
                continue
            node = doc
            for depth, part in enumerate(path[:-1], 1):
                if part not in node or not isinstance(node[part], dict):
                    node[part] = {}
                    created.append(".".join(path[:depth]))
                node = node[part]
            if path[-1] in node:
                previous.setdefault(dotted, _plain(node[path[-1]]))
            node[path[-1]] = value
            owned[dotted] = fingerprint(value)
    return dumps(spec.format, doc), {"entries": owned, "created": created,
                                     "previous": previous}


def unmerge(spec: MergeSpec, current: str, record: dict, where: str,
            force: bool = False) -> tuple[str, bool]:
    """Remove what ``record`` says we own from ``current``.

    Returns:
        (the new text, whether the document is now empty)

    Raises:
        HarnessError: one of our entries was edited by the user (and not ``force``).
    """
    doc = loads(spec.format, current, where)
    owned: dict[str, str] = record.get("entries", {})
    created = set(record.get("created", []))
    previous: dict[str, Any] = record.get("previous", {})
    if doc is None:
        return current, True
    if spec.strategy == "list-by-key":
        for i in range(len(doc) - 1, -1, -1):  # in place, keeping comments on the rest
            e = doc[i]
            ident = str(e.get(spec.key)) if isinstance(e, dict) else None
            if ident not in owned:
                continue
            if fingerprint(e) != owned[ident] and not force:
                raise HarnessError(f"the entry {spec.key}={ident} in {where} was edited "
                                   "since mlx-kit wrote it", hint="pass --force to remove it")
            if ident in previous:
                doc[i] = previous[ident]  # the user's own entry by that key, as it was
            else:
                del doc[i]
        is_empty = len(doc) == 0
    else:
        for dotted, fp in owned.items():
            path = _path(dotted)
            parent = _get(doc, path[:-1]) if len(path) > 1 else doc
            if not isinstance(parent, dict) or path[-1] not in parent:
                continue
            if fingerprint(parent[path[-1]]) != fp and not force:
                raise HarnessError(f"{dotted} in {where} was edited since mlx-kit wrote it",
                                   hint="pass --force to remove it")
            if dotted in previous:
                parent[path[-1]] = previous[dotted]  # the user's value, as it was
                continue
            del parent[path[-1]]
            # drop the parents we created, once empty (never the user's own, even empty)
            for depth in range(len(path) - 1, 0, -1):
                node = _get(doc, path[:depth])
                if ".".join(path[:depth]) not in created or not (isinstance(node, dict)
                                                                 and not node):
                    break
                holder = _get(doc, path[:depth - 1]) if depth > 1 else doc
                del holder[path[depth - 1]]
        is_empty = len(doc) == 0
    return dumps(spec.format, doc), is_empty


def owned_fingerprints(spec: MergeSpec, doc: Any, record: dict) -> dict[str, str]:
    """The current fingerprints of the entries ``record`` says we own (missing ones are
    left out): equal to ``record["entries"]`` when nobody changed them."""
    current: dict[str, str] = {}
    for ident in record.get("entries", {}):
        if spec.strategy == "list-by-key":
            found = next((e for e in doc or [] if isinstance(e, dict)
                          and str(e.get(spec.key)) == ident), None)
        else:
            found = _get(doc, _path(ident))
        if found is not None:
            current[ident] = fingerprint(found)
    return current
