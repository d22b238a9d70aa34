"""Keeping the user's comments through a round-trip dump that would drop them: the few
places where ruamel.yaml (0.19) attaches a comment to the entry we delete, or to nothing.

Our own code because no option of ruamel.yaml does either (it has no API to move a
comment from one node to another); both helpers work on its documented ``.ca`` comment
attributes and leave JSON, JSONC and TOML documents to the plain operation.
"""

from __future__ import annotations

from typing import Any

from kit.harness import comments
from kit.harness.formats import dumps

#: ``delete_keeping_comments``' default: delete the entry (None is a value to put there)
NOTHING = object()


def dumps_keeping_end(fmt: str, source: str, doc: Any) -> str:
    """``dumps(fmt, doc)``, with the comment lines at the end of ``source`` (the text
    ``doc`` was loaded from) put back at the end when the parser dropped them all.

    ruamel.yaml (0.19) attaches no comment that follows an empty item of a nested list at
    the end of the document (``- - `` then ``# note``), so the load loses it; no option
    keeps it. At the end of the file is where it was, so appending it there, as it was,
    gives the user's bytes back (a comment changes no content). A comment lost elsewhere
    is :func:`kit.harness.proof.dropped_comments`' to find."""
    out = dumps(fmt, doc)
    if fmt not in ("yaml", "toml"):  # JSONC is edited in place, json has no comments
        return out
    block = comments.trailing_block(source)
    lost = comments.comments(fmt, source) - comments.comments(fmt, out)
    if not block or comments.comments(fmt, block) - lost:
        return out  # nothing at the end, or the parser kept (some of) it
    return out + ("" if not out or out.endswith(("\n", "\r")) else "\n") + block


def delete_keeping_comments(seq: Any, i: int, replacement: Any = NOTHING) -> None:
    """``del seq[i]`` (or ``seq[i] = replacement``), but the own-line comments ruamel.yaml
    attached to the end of that entry (a comment the user wrote on the lines after it: yaml
    has no other owner for it) move to the entry before it (or above the list), so they
    stay the user's bytes. Plain lists (JSON): a plain delete or assignment."""
    item = seq[i]
    moved = None
    ca = getattr(item, "ca", None)
    if ca is not None and isinstance(item, dict) and item:
        last = list(item)[-1]
        tokens = ca.items.get(last)
        tok = tokens[2] if tokens and len(tokens) > 2 else None
        if tok is not None and "\n" in tok.value:
            own_lines = tok.value[tok.value.index("\n") + 1:]  # not our line's own comment
            moved = own_lines if own_lines.strip() else None
    if replacement is NOTHING:
        del seq[i]
    else:
        seq[i] = replacement
    if not moved:
        return
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    prev = seq[i - 1] if i > 0 else None
    if not isinstance(prev, dict) or not prev or getattr(prev, "ca", None) is None:
        # first (or only) entry: the comment goes above the list (a comment on the line
        # after an empty list is lost by ruamel when it dumps "[]")
        if getattr(seq, "ca", None) is None:
            return
        if seq.ca.comment is None:
            seq.ca.comment = [None, []]
        if seq.ca.comment[1] is None:
            seq.ca.comment[1] = []
        seq.ca.comment[1].append(CommentToken(moved.lstrip("\n"), CommentMark(0), None))
        return
    last = list(prev)[-1]
    tokens = prev.ca.items.setdefault(last, [None, None, None, None])
    if tokens[2] is None:
        tokens[2] = CommentToken("\n" + moved, CommentMark(0), None)
    else:
        tokens[2].value = tokens[2].value.rstrip("\n") + "\n" + moved
