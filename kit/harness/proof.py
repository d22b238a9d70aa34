"""The ownership rules: what proves that a file, or an entry in a user's file, is mlx-kit's
to change. Every decision of the planning (:mod:`kit.harness.plan`, install, and
:mod:`kit.harness.plan_remove`, removal) that touches a user's bytes asks here, and nothing
else decides it.

The proofs, strongest first:

- **the manifest record, trusted**: its install id and last-written hash equal the receipt
  beside the backups (:mod:`kit.harness.evidence`); a record that differs is from another
  install or an older generation (stale) and proves nothing;
- **the recorded hash**: a drop-in whose sha256 is the one we recorded is unedited;
- **the marker**: a drop-in carries :data:`kit.harness.render.MARKER` at its top;
- **the receipt**: an earlier install of this path happened (with the manifest gone);
- **fingerprints**: a merged entry still holds what we wrote (:func:`merge.fingerprint`).

Without a trusted record (:func:`recovered_record`), an entry of a merged file is ours when
it carries the marker (Qwen's ``description``, llm's ``mlx_kit`` key) or sits under a key
named after us (``mlx-kit`` in Zed's and Crush's providers, ``MLX_KIT_API_KEY``) and the
receipt says we installed; a plain value at a shared key (Qwen's ``model.name``) only when
it is what we write *and* the backup shows we changed it (or the receipt says the file did
not exist before us). The user's original comes back byte for byte only when nothing of
theirs would be lost (:func:`restores_original`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from kit.errors import HarnessError
from kit.harness import comments, evidence
from kit.harness.files import sha256_text
from kit.harness.formats import dumps, loads
from kit.harness.merge import (MergeSpec, content_fingerprint, entry_id, find_entry,
                               fingerprint, get_at, has_at, list_selector, owned_entry,
                               path_of)
from kit.harness.render import API_KEY_ENV, MARKER, PROVIDER_ID, context, render
from kit.harness.spec import FileSpec, HarnessSpec

#: Stand-in models for rendering what we write at shared keys (values that do not depend
#: on the server: model names, auth types, key variables).
_MODELS = [{"id": "local", "name": "local", "model": "-", "context_window": 8192,
            "max_tokens": 2048, "capabilities": {"tools": False, "reasoning": False,
                                                 "vision": False}}]


def is_ours(text: str) -> bool:
    """Whether a drop-in carries our marker at its top (in a comment, or in a JSON key for
    formats without comments)."""
    return bool(text) and MARKER in text[:300]


def trusted(agent: str, f: dict) -> bool:
    """Whether a manifest record of a file (``{"path", "sha256", "install_id", ...}``) is
    from the install that the receipt beside the backups describes."""
    receipt = evidence.read_receipt(agent, Path(f["path"]))
    if "install_id" not in f:  # recorded before receipts existed
        return receipt is None
    return receipt is not None and receipt.get("install_id") == f["install_id"] \
        and receipt.get("sha256") == f.get("sha256")


def lost_install(spec: HarnessSpec, entry: dict | None) -> bool:
    """Whether an earlier install left evidence (a receipt) that the manifest's ``entry``
    for the agent has no trusted record of: install then first removes what is provably
    ours, so the user's original is what gets backed up again."""
    entry = entry or {}
    if entry and all(trusted(spec.name, f) for f in entry["files"]):
        return False
    paths = [str(p) for _, p in spec.file_paths()] + [f["path"] for f in entry.get("files", [])]
    return any(evidence.read_receipt(spec.name, Path(p)) for p in paths)


def shared_with(agent: str, merged: bool, claim: tuple[str, bool] | None) -> str | None:
    """The other agent whose install wrote this path too, when that forbids ``agent``'s
    change: the marker says "mlx-kit's", not whose, so a copy of pi's spec under another
    name (what docs/agents/adding-an-agent.md suggests) would overwrite pi's drop-in and
    its removal delete it. Two agents may share a file only when both merge their own
    entries into it.

    Args:
        claim: (the other agent, whether it merges into the file), or None.
    """
    if claim is None or claim[0] == agent or (merged and claim[1]):
        return None
    return claim[0]


def edited_since_written(text: str, recorded_sha: str | None) -> bool:
    """Whether a file we wrote (hash ``recorded_sha``; None: not recorded) was edited."""
    return bool(recorded_sha) and sha256_text(text) != recorded_sha


def deletable_created_file(fmt: str, unmerged: str, is_empty: bool, created: bool) -> bool:
    """A merged file our install created may be deleted when nothing but our entries was
    in it: a comment the user wrote in it keeps the file."""
    return is_empty and created and not comments.comments(fmt, unmerged)


def restores_original(m: MergeSpec, current: str, unmerged: str, original: str | None,
                      original_fp: str | None, written_sha: str | None, where: str) -> bool:
    """Whether putting the user's original bytes (``original``, the backup's text) back
    loses nothing of theirs: what is left without our entries has the original's content
    (fingerprint ``original_fp``), and the file is untouched since we wrote it (its hash
    is ``written_sha``) or holds no comment the original lacks (an agent that rewrote the
    file reformats it but adds no comments; a comment the user added since is theirs).

    The comments are those of the file as it is (``current``), not of ``unmerged``: the
    parser may drop a comment on the way (ruamel.yaml, after ``- - `` at a list's end),
    and a comment it dropped is still one the backup lacks. Our templates write no
    comments into a merged file, so each comment ``current`` has is the user's or was
    in the original."""
    if original is None or original_fp is None \
            or original_fp != content_fingerprint(m, unmerged, where):
        return False
    if written_sha and sha256_text(current) == written_sha:
        return True
    return not comments.added(m.format, current, original)


def dropped_comments(fmt: str, old: str, new: str, backup: str | None,
                     where: str) -> tuple[list[str], list[str]]:
    """The user's comments that the parser cannot hold and that writing ``new`` over
    ``old`` leaves nowhere in the file, each once, split into (those the backup of the
    user's original, ``backup``, holds; those no copy holds). They are the comments of
    ``old`` that ``new`` lacks and a plain load and dump of ``old`` loses too, and those
    of ``backup`` that ``new`` lacks and a load and dump of ``backup`` loses (install's
    merge dropped them; a comment the user deleted since is not one of these). Comments
    on entries of ours that the rewrite takes out are not listed; JSONC (edited in place)
    loses none.

    Raises:
        HarnessError: ``old`` does not parse.
    """
    now = comments.comments(fmt, new)
    lost = _unparsed(fmt, old, where) - now
    saved = comments.comments(fmt, backup or "")
    try:
        at_install = _unparsed(fmt, backup, "the backup") - now if backup else Counter()
    except HarnessError:  # not ours to judge: the backup is kept as it is elsewhere
        at_install = Counter()
    return (sorted({c for c in lost if c in saved} | set(at_install)),
            sorted(c for c in lost if c not in saved))


def _unparsed(fmt: str, text: str, where: str) -> Counter[str]:
    """The comments of ``text`` that a load and dump by the parser loses."""
    had = comments.comments(fmt, text)
    if not had or fmt == "jsonc":
        return Counter()
    doc = loads(fmt, text, where)
    return had - (comments.comments(fmt, dumps(fmt, doc)) if doc is not None else Counter())


def comments_refusal(path: Path, fmt: str, lost: list[str], doing: str) -> HarnessError:
    """The error that refuses a write (``doing``: "merging" or "removing" mlx-kit's
    entries) that would lose the user's comments ``lost`` (:func:`dropped_comments`)."""
    what = f"comment {lost[0]!r}" if len(lost) == 1 else \
        f"comments {', '.join(map(repr, lost))}"
    return HarnessError(
        f"{doing} mlx-kit's entries {'into' if doing == 'merging' else 'from'} {path} would "
        f"drop your {what}: the {fmt} parser cannot keep a comment where it is; nothing "
        "was written", hint="move the comment to the top or the end of the file, then run "
        "the command again")


def _has_marker(value: Any) -> bool:
    if isinstance(value, str):
        return MARKER in value
    if isinstance(value, dict):
        return any(_has_marker(k) or _has_marker(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_marker(v) for v in value)
    return False


def _named_after_us(dotted: str) -> bool:
    return dotted.split(".")[-1] in (PROVIDER_ID, API_KEY_ENV)


def ours_fragment(spec: HarnessSpec, fspec: FileSpec) -> Any:
    """What we write into a merged file, parsed (rendered for a stand-in server: the
    values at shared keys do not depend on it)."""
    text = render(spec, context("http://127.0.0.1:1/v1", _MODELS, "recovery"))[fspec.path]
    return loads(fspec.merge.format, text, f"{fspec.path} (rendered)")


def recovered_record(m: MergeSpec, doc: Any, fragment: Any, original: Any,
                     created_file: bool, evidenced: bool, where: str) -> tuple[dict, list[str]]:
    """The ownership record (as :func:`merge.merge` returns it) of what in ``doc`` is
    provably ours with no trusted manifest record, and notes on what looks like ours but
    cannot be proved.

    Args:
        doc: the file's document now; ``fragment``: what we write (:func:`ours_fragment`).
        original: the backup's document (None: no backup); ``created_file``: the receipt
            says the file did not exist before us; ``evidenced``: there is a receipt.
    """
    entries: dict[str, str] = {}
    previous: dict[str, Any] = {}
    notes: list[str] = []
    has_original = original is not None or created_file  # what was there before us

    def list_entries(path: list[str], key: str) -> None:
        ids = {str(e.get(key)) for e in (get_at(fragment, path) if path else fragment) or []
               if isinstance(e, dict)}
        current = get_at(doc, path) if path else doc
        for ident in ids:
            at = find_entry(current, key, ident)
            if at is None or not _has_marker(current[at]):
                continue
            rid = entry_id(path, key, ident) if path else ident
            entries[rid] = fingerprint(current[at])
            theirs = get_at(original, path) if path else original
            was = find_entry(theirs, key, ident)
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
        path = path_of(item)
        value, ours = get_at(doc, path), get_at(fragment, path)
        if value is None:
            continue
        # A key named after us is our namespace, but a user may have an entry of their own
        # there (install keeps it in the backup): proof needs the receipt too.
        mine = _has_marker(value) or (_named_after_us(item) and evidenced and (
            isinstance(value, dict) or fingerprint(value) == fingerprint(ours)))
        had = has_at(original, path)
        before = get_at(original, path) if had else None
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
            spec_path = owned_entry(m, item)
            path = spec_path[0] if spec_path else path_of(item)[:-1]
            for depth in range(1, len(path) + 1):
                dotted = ".".join(path[:depth])
                if dotted not in created and not has_at(original, path[:depth]):
                    created.append(dotted)
    return {"entries": entries, "created": created, "previous": previous}, notes
