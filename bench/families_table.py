"""docs/models.md's table of model families, from the end-to-end family tests' record
(tests/families/test_families.py): tool format, parser module, reasoning, the protocols
every case passed through, and the prompt cache's reuse on the next turn. Model-free.

    # run the family table, recording its results, then render them into docs/models.md
    MLX_KIT_FAMILIES_RECORD=/tmp/families.json pytest tests/families/test_families.py
    PYTHONPATH=. python bench/families_table.py --record /tmp/families.json --write

``--record PATH`` reads that record and (with ``--write``) keeps it as bench/families.json,
the copy committed with the docs; without it bench/families.json is read. ``--write``
replaces the table between docs/models.md's markers; without it the table is printed.
tests/families/test_docs_table.py checks that docs/models.md is what this renders from
bench/families.json, so the docs cannot drift from the recorded results.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "bench" / "families.json"
DOCS = ROOT / "docs" / "models.md"
BEGIN, END = "<!-- families-table: bench/families_table.py -->", "<!-- /families-table -->"

#: the cases each protocol's row runs (a protocol is verified when all of them passed)
CASES = {
    "chat": ("call", "stream = non-stream, nested + unicode", "cut by max_tokens", "next turn",
             "reasoning sent back"),
    "responses": ("call, stream = non-stream", "next turn"),
    "messages": ("call, stream = non-stream, nested + unicode", "next turn"),
    "gemini": ("call, stream = non-stream", "next turn"),
}
NAMES = {"chat": "chat", "responses": "Responses", "messages": "Messages", "gemini": "Gemini"}


def _reuse(cache: dict[str, list[int]]) -> str:
    cells = [f"{NAMES[p]} {c}/{n} ({100 * c / n:.0f} %)" for p in CASES
             if (cn := cache.get(p)) for c, n in [cn] if n]
    return ", ".join(cells) or "—"


def render(record: dict) -> str:
    """The markdown table (no trailing newline) for a record
    ``{"families": {name: {tool_format, reasoning_format, parser, cases, cache}}}``."""
    rows = ["| family | tool format | parser | reasoning | verified protocols "
            "| next turn cached / prompt |",
            "|---|---|---|---|---|---|"]
    for name, f in sorted(record["families"].items()):
        cases = f.get("cases", {})
        if f.get("tool_format"):
            cells = []
            for p, want in CASES.items():
                missing = [c for c in want if c not in cases.get(p, ())]
                cells.append(NAMES[p] if not missing
                             else f"{NAMES[p]} except {'; '.join(missing)}")
            protocols = ", ".join(cells)
        else:
            ok = "no parser: forced call 400" in cases.get("models", ())
            protocols = "tools=false" + ("; a forced call is a 400 naming tool_choice"
                                         if ok else "")
        if "capabilities" not in cases.get("models", ()):
            protocols += "; /v1/models formats NOT as expected"
        parser = f"`{f['parser']}`" if f.get("parser") else "—"
        rows.append(f"| {name} | {f.get('tool_format') or '—'} | {parser} "
                    f"| {f.get('reasoning_format') or '—'} | {protocols} "
                    f"| {_reuse(f.get('cache', {}))} |")
    return "\n".join(rows)


def replace_block(docs: str, table: str) -> str:
    """``docs`` with the text between the markers replaced by ``table``.

    Raises:
        ValueError: the markers are missing.
    """
    i, j = docs.find(BEGIN), docs.find(END)
    if i < 0 or j < i:
        raise ValueError(f"docs/models.md has no {BEGIN} ... {END} block")
    return docs[:i + len(BEGIN)] + "\n" + table + "\n" + docs[j:]


def block(docs: str) -> str:
    """The table between the markers of ``docs`` (stripped)."""
    i, j = docs.find(BEGIN), docs.find(END)
    return docs[i + len(BEGIN):j].strip() if i >= 0 and j > i else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, default=None)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    source = args.record or RECORD
    record = json.loads(source.read_text("utf-8"))
    table = render(record)
    if not args.write:
        print(table)
        return 0
    if args.record is not None and args.record.resolve() != RECORD.resolve():
        RECORD.write_text(json.dumps(record, indent=1, ensure_ascii=False, sort_keys=True)
                          + "\n", "utf-8")
    DOCS.write_text(replace_block(DOCS.read_text("utf-8"), table), "utf-8")
    print(f"wrote {DOCS.relative_to(ROOT)} from {RECORD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
