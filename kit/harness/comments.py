"""The comments in a user's config file, so a removal can tell a file whose only change
since install is ours from one the user has since commented in.

No library answers "which comments does this text hold" for all our formats alike
(ruamel.yaml and tomlkit attach comments to nodes, each in its own way), so: JSONC through
json-five's tokenizer (the one :mod:`kit.harness.jsonc` edits with), YAML and TOML with a
small line scanner (``#`` at a line's start or after whitespace, outside quotes on that
line). The scanner may miss an exotic comment (one after a multi-line string); it never
sees one where there is none in the configs these agents write.
"""

from __future__ import annotations

from collections import Counter


def _hash_comments(text: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for line in text.splitlines():
        quote = None
        for i, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "\"'":
                quote = ch
            elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
                found[line[i:].strip()] += 1
                break
    return found


def comments(fmt: str, text: str) -> Counter[str]:
    """Each comment in ``text`` (stripped of surrounding whitespace) -> how many times it
    occurs. ``fmt`` is the merge format ("jsonc", "json", "yaml", "toml"). A text the
    tokenizer rejects falls back to the line scanner (never raises)."""
    if fmt in ("jsonc", "json"):
        try:
            from json5.tokenizer import tokenize

            return Counter(t.value.strip() for t in tokenize(text)
                           if t.type in ("LINE_COMMENT", "BLOCK_COMMENT"))
        except Exception:  # noqa: BLE001 - the tokenizer's own error types
            pass
    return _hash_comments(text)


def added(fmt: str, now: str, before: str) -> bool:
    """Whether ``now`` holds a comment (or more copies of one) that ``before`` lacks."""
    return bool(comments(fmt, now) - comments(fmt, before))


def trailing_block(text: str) -> str:
    """The blank and ``#``-comment lines at the end of ``text``, as they are ("" when its
    last line is content, or it holds no comment); for the hash formats (YAML, TOML)."""
    lines = text.splitlines(keepends=True)
    start = len(lines)
    while start and (not lines[start - 1].strip() or lines[start - 1].lstrip().startswith("#")):
        start -= 1
    block = "".join(lines[start:])
    return block if _hash_comments(block) else ""
