"""Merging our entries into a config file the user shares with us, and taking them out
again — by keys, not bytes (agents may rewrite their files).

Two strategies, chosen per file in the agent's spec:

- ``list-by-key``: the document is a list of entries identified by ``key`` (llm's
  extra-openai-models.yaml, by ``model_id``); ours replace entries with the same key or are
  appended, and removal deletes exactly those entries.
- ``keys``: the document is a mapping; we own the dotted paths in ``owns`` (e.g.
  ``provider.mlx-kit``) and set them to what the template rendered; removal deletes them.
  An ``owns`` item may also name a list inside the mapping and the key its entries are
  identified by, ``modelProviders.openai[id]`` (Qwen Code's settings.json): we own the
  entries of that list which the template rendered, by that key (the user's other entries
  in the same list stay), as ``list-by-key`` does for a whole file. Parents (and a list)
  we had to create are dropped on removal once empty. An owned plain value (a string,
  number...) that no longer holds what we wrote was set again by the user or by the agent
  on their behalf (a model picker): removal leaves it as it is.

Every other entry, key, comment and the order of the file stay as they were (round-trip
parsers, :mod:`kit.harness.formats`). The manifest records a hash of each value we wrote,
so removal can tell when the user edited one of our entries.

Pure document transforms, text in and text out: nothing here reads or writes a file or
decides what is ours to change (:mod:`kit.harness.plan` and :mod:`kit.harness.proof` do);
the comments ruamel.yaml would drop are kept by :mod:`kit.harness.keep_comments`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from kit.errors import HarnessError
from kit.harness.formats import dumps, empty, loads
from kit.harness.keep_comments import NOTHING, delete_keeping_comments, dumps_keeping_end


@dataclass(frozen=True)
class MergeSpec:
    """How our fragment goes into a shared file (see the module docstring)."""

    format: str
    strategy: str
    key: str | None = None
    owns: tuple[str, ...] = ()
    #: Dotted paths inside our owned values that the agent itself rewrites on every run
    #: (Cline stamps providers.<id>.updatedAt): left out of the edit check.
    stamped: tuple[str, ...] = ()


def plain(value: Any) -> Any:
    """``value`` as plain dicts, lists and scalars (round-trip containers unwrapped)."""
    unwrap = getattr(value, "unwrap", None)  # tomlkit items
    if callable(unwrap):
        value = unwrap()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def fingerprint(value: Any) -> str:
    """A hash of a value's content, independent of formatting and comments."""
    text = json.dumps(plain(value), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def owned_fingerprint(spec: MergeSpec | None, dotted: str, value: Any) -> str:
    """The fingerprint of our value at the owned path ``dotted``, less the keys under it
    that ``spec.stamped`` names: an agent that stamps them on every run (a timestamp) has
    not edited our entry."""
    drop = [s[len(dotted) + 1:].split(".") for s in (spec.stamped if spec else ())
            if s.startswith(dotted + ".")]
    if not drop:
        return fingerprint(value)
    value = copy.deepcopy(plain(value))
    for path in drop:
        node = value
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return fingerprint(value)


def _kind(spec: MergeSpec) -> str:
    return "list" if spec.strategy == "list-by-key" else "mapping"


def content_fingerprint(spec: MergeSpec, text: str, where: str) -> str:
    """The fingerprint of a shared file's content. A file that holds no document (empty,
    blank, or only comments) counts as the empty list or mapping the agent's file holds:
    that is what removing our entries from it leaves.

    Raises:
        HarnessError: the text does not parse.
    """
    doc = loads(spec.format, text, where)
    return fingerprint(empty(spec.format, _kind(spec)) if doc is None else doc)


def path_of(dotted: str) -> list[str]:
    """``"a.b.c"`` -> ``["a", "b", "c"]``."""
    return dotted.split(".")


_SELECTOR = re.compile(r"(?P<path>[^\[\]]+)\[(?P<key>[^\[\]=.]+)\]")


def list_selector(owned: str) -> tuple[list[str], str] | None:
    """``"a.b[id]"`` -> (``["a", "b"]``, ``"id"``): the entries of the list at ``a.b``,
    identified by their ``id``; None for a plain dotted key.

    Raises:
        HarnessError: ``owned`` has brackets but is not ``dotted.path[key]``.
    """
    if "[" not in owned and "]" not in owned:
        return None
    m = _SELECTOR.fullmatch(owned)
    if m is None:
        raise HarnessError(f"owns entry {owned!r}: expected a dotted path, or a dotted path "
                           "to a list followed by [key]")
    return path_of(m["path"]), m["key"]


def entry_id(path: list[str], key: str, value: Any) -> str:
    """The record's id of one owned list entry: ``a.b[id=local]``."""
    return f"{'.'.join(path)}[{key}={value}]"


def owned_entry(spec: MergeSpec, ident: str) -> tuple[list[str], str, str] | None:
    """The (list path, key, value) of a recorded list-entry id, None for a dotted key."""
    for owned in spec.owns:
        sel = list_selector(owned)
        if sel is None:
            continue
        prefix = f"{'.'.join(sel[0])}[{sel[1]}="
        if ident.startswith(prefix) and ident.endswith("]"):
            return sel[0], sel[1], ident[len(prefix):-1]
    return None


def find_entry(entries: Any, key: str, value: str) -> int | None:
    """The index of the entry whose ``key`` is ``value`` in a list, or None."""
    if not isinstance(entries, list):
        return None
    return next((i for i, e in enumerate(entries)
                 if isinstance(e, dict) and str(e.get(key)) == value), None)


def _put(entries: list, key: str, entry: Any, ident: str, owned: dict, previous: dict) -> None:
    """Put ``entry`` into ``entries`` by ``key``: replace the entry with the same key
    (remembering the user's in ``previous``) or append it; record its fingerprint."""
    at = find_entry(entries, key, str(entry[key]))
    if at is None:
        entries.append(entry)
    else:
        previous.setdefault(ident, plain(entries[at]))
        entries[at] = entry
    owned[ident] = fingerprint(entry)


def _parents(doc: dict, path: list[str], created: list[str], where: str) -> dict:
    """The mapping at ``path`` in ``doc``, creating missing levels and recording them in
    ``created``.

    Raises:
        HarnessError: a level holds something else than a mapping (the user's value is
            never replaced by a parent of ours).
    """
    node = doc
    for depth, part in enumerate(path, 1):
        if part not in node:
            node[part] = {}
            created.append(".".join(path[:depth]))
        elif not isinstance(node[part], dict):
            raise HarnessError(f"{'.'.join(path[:depth])} in {where} should hold a mapping; "
                               "it does not", hint="fix the file (mlx-kit changes nothing "
                               "until it has the shape the agent uses)")
        node = node[part]
    return node


def _prune(doc: dict, path: list[str], created: set[str]) -> None:
    """Delete the containers at ``path`` and above that we created, innermost first, while
    they are empty (never the user's own, even empty)."""
    for depth in range(len(path), 0, -1):
        node = get_at(doc, path[:depth])
        if ".".join(path[:depth]) not in created or not isinstance(node, (dict, list)) or node:
            break
        holder = get_at(doc, path[:depth - 1]) if depth > 1 else doc
        del holder[path[depth - 1]]


def get_at(doc: Any, path: list[str]) -> Any:
    """The value at ``path`` (a list of keys) in ``doc``, or None when a level is missing."""
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def has_at(doc: Any, path: list[str]) -> bool:
    """Whether ``doc`` has a key at ``path`` (holding null counts: null is not absent)."""
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True


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
    doc = loads(spec.format, current or "", where) if current is not None else None
    kept = ""  # a file with no document but comments (all entries commented out) keeps them
    if doc is None:
        doc = empty(spec.format, _kind(spec))
        lines = [line.strip() for line in (current or "").splitlines() if line.strip()]
        if lines and all(line.startswith("#") for line in lines):
            kept = current if current.endswith("\n") else current + "\n"
    owned: dict[str, str] = {}
    created: list[str] = []  # parent tables we had to add (removal drops them if empty)
    previous: dict[str, Any] = {}  # the user's values we replaced (removal puts them back)
    if spec.strategy == "list-by-key":
        if not isinstance(doc, list):
            raise HarnessError(f"{where} should hold a list of entries; it does not")
        for entry in fragment or []:
            _put(doc, spec.key, entry, str(entry[spec.key]), owned, previous)
    else:
        if not isinstance(doc, dict):
            raise HarnessError(f"{where} should hold a mapping; it does not")
        for dotted in spec.owns:
            selector = list_selector(dotted)
            if selector is not None:  # entries of a list inside the mapping, by key
                path, key = selector
                entries = get_at(fragment, path)
                if entries is None:
                    continue
                holder = _parents(doc, path[:-1], created, where)
                if path[-1] not in holder:
                    holder[path[-1]] = []
                    created.append(".".join(path))
                if not isinstance(holder[path[-1]], list):
                    raise HarnessError(f"{'.'.join(path)} in {where} should hold a list; "
                                       "it does not")
                for entry in entries:
                    _put(holder[path[-1]], key, entry, entry_id(path, key, entry[key]),
                         owned, previous)
                continue
            path = path_of(dotted)
            value = get_at(fragment, path)
            if value is None:
                continue
            node = _parents(doc, path[:-1], created, where)
            if path[-1] in node:
                previous.setdefault(dotted, plain(node[path[-1]]))
            node[path[-1]] = value
            owned[dotted] = owned_fingerprint(spec, dotted, value)
    # (a file of comments only is kept whole above)
    text = kept + dumps(spec.format, doc) if kept else \
        dumps_keeping_end(spec.format, current or "", doc)
    return text, {"entries": owned, "created": created, "previous": previous}


def merged_again(first: dict | None, again: dict, spec: MergeSpec | None = None) -> dict:
    """The record of an install over our own earlier one (``launch`` installs every time).

    ``merge`` on a file that already holds our entries sees them as values to replace and
    their parents as existing. Per owned key, what removal must put back is what the file
    held before *our* value went in: where the value ``merge`` just replaced is still the
    one we wrote, that is the first install's record (the user's value it replaced, or
    nothing); where the user changed or deleted our value since, it is what the file held
    now (their newer value, or nothing) — never an older value they already replaced.
    Parents the first install created stay ours.

    Args:
        first: the record in the manifest (None: nothing of ours was merged yet).
        again: the record ``merge`` just returned.
        spec: the file's merge spec (its ``stamped`` keys are not an edit of ours).
    """
    if not first:
        return again
    ours = first.get("entries", {})
    replaced = again.get("previous", {})
    previous: dict[str, Any] = {}
    for key in again.get("entries", {}):
        if key in replaced and owned_fingerprint(spec, key, replaced[key]) != ours.get(key):
            previous[key] = replaced[key]  # the user's value, written after our install
        elif key in replaced and key in first.get("previous", {}):
            previous[key] = first["previous"][key]  # still ours: what we replaced first
    created = list(first.get("created", []))
    created += [c for c in again.get("created", []) if c not in created]
    return {"entries": again.get("entries", {}), "created": created, "previous": previous}


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
        for ident in owned:  # in place, keeping comments on the rest
            i = find_entry(doc, spec.key, ident)  # ours is the first by that key (_put): a
            if i is None:                    # later one with the same key is the user's
                continue
            if fingerprint(doc[i]) != owned[ident] and not force:
                raise HarnessError(f"the entry {spec.key}={ident} in {where} was edited "
                                   "since mlx-kit wrote it", hint="pass --force to remove it")
            # the user's own entry by that key, as it was; or none
            delete_keeping_comments(doc, i, previous.get(ident, NOTHING))
        is_empty = len(doc) == 0
    else:
        for dotted, fp in owned.items():
            entry = owned_entry(spec, dotted)
            if entry is not None:  # an entry of a list inside the mapping
                path, key, value = entry
                parent, name = get_at(doc, path), find_entry(get_at(doc, path), key, value)
                label = f"the entry {key}={value} of {'.'.join(path)}"
                container = path
            else:
                path = path_of(dotted)
                parent = get_at(doc, path[:-1]) if len(path) > 1 else doc
                name = path[-1] if isinstance(parent, dict) and path[-1] in parent else None
                label, container = dotted, path[:-1]
            if name is None:
                continue
            if owned_fingerprint(spec, dotted, parent[name]) != fp:
                # A plain value set again since (e.g. by the agent's model picker) is the
                # user's choice now: kept as it is, with or without --force.
                if entry is None and not isinstance(parent[name], (dict, list)):
                    continue
                if not force:
                    raise HarnessError(f"{label} in {where} was edited since mlx-kit wrote it",
                                       hint="pass --force to remove it")
            if dotted in previous:
                parent[name] = previous[dotted]  # the user's value, as it was
                continue
            del parent[name]
            _prune(doc, container, created)  # the parents we created, once empty
        is_empty = len(doc) == 0
    return dumps_keeping_end(spec.format, current, doc), is_empty


def owned_fingerprints(spec: MergeSpec, doc: Any, record: dict) -> dict[str, str]:
    """The current fingerprints of the entries ``record`` says we own (missing ones are
    left out): equal to ``record["entries"]`` when nobody changed them."""
    current: dict[str, str] = {}
    for ident in record.get("entries", {}):
        entry = owned_entry(spec, ident) if spec.strategy == "keys" else None
        if spec.strategy == "list-by-key":
            at = find_entry(doc, spec.key, ident)
            found = doc[at] if at is not None else None
        elif entry is not None:
            entries = get_at(doc, entry[0])
            at = find_entry(entries, entry[1], entry[2])
            found = entries[at] if at is not None else None
        else:
            found = get_at(doc, path_of(ident))
        if found is not None:
            current[ident] = owned_fingerprint(spec if entry is None else None, ident, found)
    return current
