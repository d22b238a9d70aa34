"""Removal without a manifest record to trust (the manifest is corrupt, deleted, or from
another install): only what can be proved ours is touched.

Proof, per file of the agent's spec:

- a drop-in file is ours when it carries :data:`kit.harness.render.MARKER` at its top;
- in a merged file (only with the receipt that our install leaves beside the backups, or
  with ``--force``: a marked entry with no receipt may be a copy the user kept after a
  removal), an entry is ours when it carries the marker (a string holding it,
  e.g. Qwen's ``description``, llm's ``mlx_kit`` key), or when it sits under a key named
  after us (our provider id ``mlx-kit`` in Zed's and Crush's files, whose schemas leave no
  room for a marker; our key variable ``MLX_KIT_API_KEY``), is a mapping or what we write
  there; a plain value at a shared key (Qwen's ``model.name``) is ours only when it is
  what we write *and* the evidence (:mod:`kit.harness.evidence`) shows we wrote there: the user's original from before install lacks it or holds another
  value (put back), or the receipt says the file did not exist before us;
- the user's original (the backup) is put back byte for byte when what is left equals it,
  a file is deleted only when the receipt says our install created it and nothing else is
  left in it; folders only when the receipt says we created them, and only when empty.

Everything else stays, and each thing left is said (``Removal.notes``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from kit.errors import HarnessError
from kit.harness import comments, evidence
from kit.harness.files import check_writable, read_text, sha256_text
from kit.harness.formats import loads
from kit.harness.merge import (MergeSpec, _entry_id, _find, _get, _owned_entry, _path,
                               content_fingerprint, fingerprint, list_selector, unmerge)
from kit.harness.render import API_KEY_ENV, MARKER, PROVIDER_ID, context, render
from kit.harness.spec import FileSpec, HarnessSpec

#: Stand-in models for rendering what we write at shared keys (values that do not depend
#: on the server: model names, auth types, key variables).
_MODELS = [{"id": "local", "name": "local", "model": "-", "context_window": 8192,
            "max_tokens": 2048, "capabilities": {"tools": False, "reasoning": False,
                                                 "vision": False}}]


def _has_marker(value: Any) -> bool:
    if isinstance(value, str):
        return MARKER in value
    if isinstance(value, dict):
        return any(_has_marker(k) or _has_marker(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_marker(v) for v in value)
    return False


def is_ours(text: str) -> bool:
    """Generated files carry the marker at their top (in a comment, or in a JSON key for
    formats without comments)."""
    return bool(text) and MARKER in text[:300]


def _ours_fragment(spec: HarnessSpec, fspec: FileSpec) -> Any:
    text = render(spec, context("http://127.0.0.1:1/v1", _MODELS, "recovery"))[fspec.path]
    return loads(fspec.merge.format, text, f"{fspec.path} (rendered)")


def _has(doc: Any, path: list[str]) -> bool:
    """Whether ``doc`` has a key at ``path`` (holding null counts: null is not absent)."""
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True


def _named_after_us(dotted: str) -> bool:
    return dotted.split(".")[-1] in (PROVIDER_ID, API_KEY_ENV)


def _record(m: MergeSpec, doc: Any, fragment: Any, original: Any, created_file: bool,
            evidenced: bool, where: str) -> tuple[dict, list[str]]:
    """The ownership record (as :func:`merge.merge` returns) of what in ``doc`` is provably
    ours, and notes on what looks like ours but cannot be proved."""
    entries: dict[str, str] = {}
    previous: dict[str, Any] = {}
    notes: list[str] = []
    has_original = original is not None or created_file  # what was there before us

    def list_entries(path: list[str], key: str) -> None:
        ids = {str(e.get(key)) for e in (_get(fragment, path) if path else fragment) or []
               if isinstance(e, dict)}
        current = _get(doc, path) if path else doc
        for ident in ids:
            at = _find(current, key, ident)
            if at is None or not _has_marker(current[at]):
                continue
            rid = _entry_id(path, key, ident) if path else ident
            entries[rid] = fingerprint(current[at])
            theirs = _get(original, path) if path else original
            was = _find(theirs, key, ident)
            if was is not None:  # the user's own entry by that id, before install
                previous[rid] = theirs[was]

    if m.strategy == "list-by-key":
        if isinstance(doc, list):
            list_entries([], m.key)
        return {"entries": entries, "created": [], "previous": previous}, notes
    if not isinstance(doc, dict):
        return {"entries": {}, "created": [], "previous": {}}, notes
    for item in m.owns:
        sel = list_selector(item)
        if sel is not None:
            list_entries(*sel)
            continue
        path = _path(item)
        value, ours = _get(doc, path), _get(fragment, path)
        if value is None:
            continue
        # A key named after us is our namespace, but a user may have an entry of their own
        # there (install keeps it in the backup): proof needs the receipt too.
        mine = _has_marker(value) or (_named_after_us(item) and evidenced and (
            isinstance(value, dict) or fingerprint(value) == fingerprint(ours)))
        had = _has(original, path)
        before = _get(original, path) if had else None
        if not mine and fingerprint(value) == fingerprint(ours):
            mine = has_original and (not had or fingerprint(before) != fingerprint(value))
            if not mine and not has_original:
                notes.append(f"left {item} in {where}: it holds what mlx-kit writes, but "
                             "nothing proves mlx-kit put it there")
        if not mine:
            continue
        entries[item] = fingerprint(value)
        if had:
            previous[item] = before  # the user's value (null too), put back
    # Parents our install created: those the user's original lacks (or all of them, in a
    # file our install created); none when there is no evidence.
    created: list[str] = []
    if has_original:
        for item in entries:
            spec_path = _owned_entry(m, item)
            path = spec_path[0] if spec_path else _path(item)[:-1]
            for depth in range(1, len(path) + 1):
                dotted = ".".join(path[:depth])
                if dotted not in created and not _has(original, path[:depth]):
                    created.append(dotted)
    return {"entries": entries, "created": created, "previous": previous}, notes


def plan_merged(spec: HarnessSpec, fspec: FileSpec, path: Path,
                force: bool = False) -> tuple[tuple, list[str]]:
    """What recovery would do to a merged file: (an outcome as
    ``install._unmerged`` gives it ("restore" with the backup's path), notes).

    Raises:
        HarnessError: the file cannot be parsed or written.
    """
    m = fspec.merge
    receipt = evidence.read_receipt(spec.name, path)
    backup_text = evidence.read_backup(spec.name, path)
    if not path.is_file():
        return ("none", None), []
    current = read_text(path)
    doc = loads(m.format, current, str(path))
    original = None
    if backup_text is not None:
        try:
            original = loads(m.format, backup_text, "the backup")
        except HarnessError:
            backup_text = None
        else:  # an empty file holds the empty list or mapping the agent's file holds
            original = ([] if m.strategy == "list-by-key" else {}) if original is None \
                else original
    created_file = backup_text is None and bool(receipt) and not receipt["existed"]
    record, notes = _record(m, doc, _ours_fragment(spec, fspec), original, created_file,
                            receipt is not None, str(path))
    if not record["entries"]:
        return ("none", None), notes
    if receipt is None and not force:
        # Marked entries but no receipt: what a removal leaves when the user kept a copy
        # of our entry, or what a lost data dir leaves. Only the user can tell which.
        return ("none", None), notes + [
            f"left mlx-kit's marked entries in {path} ({', '.join(sorted(record['entries']))}): "
            "mlx-kit has no record of installing them; pass --force to remove them"]
    check_writable(path, "remove mlx-kit's entries from")
    text, is_empty = unmerge(m, current, record, str(path), force=True)
    if backup_text is not None and content_fingerprint(m, text, str(path)) == \
            content_fingerprint(m, backup_text, "the backup") and (
                (receipt is not None and sha256_text(current) == receipt.get("sha256"))
                or not comments.added(m.format, text, backup_text)):  # see removal.restorable
        return ("restore", evidence.backup_path(spec.name, path)), notes
    if is_empty and created_file and not comments.comments(m.format, text):
        return ("delete", None), notes  # a comment the user wrote in it keeps the file
    return ("write", text), notes


def plan_dropin(spec: HarnessSpec, path: Path) -> tuple[bool, list[str]]:
    """Whether recovery deletes the drop-in ``path`` (it carries our marker), and notes."""
    if not path.is_file():
        return False, []
    if is_ours(read_text(path, errors="replace")):
        check_writable(path, "remove")
        return True, []
    return False, [f"left {path}: it does not carry mlx-kit's marker"]


def restore_backup(spec: HarnessSpec, path: Path) -> bool:
    """Put the user's original back where nothing is now. Returns whether it did."""
    backup = evidence.backup_path(spec.name, path)
    if backup.is_file() and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(backup), path)
        return True
    return False


def created_dirs(spec: HarnessSpec, path: Path) -> list[str]:
    """The folders the receipt says our install created for ``path``."""
    receipt = evidence.read_receipt(spec.name, path) or {}
    return [d for d in receipt.get("created_dirs", []) if isinstance(d, str)]
