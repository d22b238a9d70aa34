"""canitoolcall 0.1.1's fixtures through mlx-kit's parser: the per-family table (supported,
pass, soft, fail, unsupported) and the overall pass-or-soft share of all 469 fixtures
(issue 14's goal: >= 97 %). Model-free; a few seconds.

    PYTHONPATH=. python bench/toolcall_conformance.py [--write-baseline] [--fails]

``--write-baseline`` rewrites tests/conformance/baseline.json with today's verdicts (do it in
the commit of a parser fix, after checking that only improvements changed). ``--fails``
lists each failing fixture with the checks it fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conformance.adapter import all_fixtures, verdict  # noqa: E402

BASELINE = ROOT / "tests" / "conformance" / "baseline.json"
ABOUT = ("Progress record toward issue 14's goal (>= 97 % of canitoolcall 0.1.1's 469 fixtures "
         "pass or soft-pass through mlx-kit's parser). NOT an allow-list: "
         "tests/conformance/test_canitoolcall.py fails when a fixture's verdict gets worse than "
         "recorded here, and a parser fix should move entries up (pass < soft < fail < unsupported) "
         "in the same commit. Regenerate with: python bench/toolcall_conformance.py --write-baseline")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-baseline", action="store_true")
    ap.add_argument("--fails", action="store_true")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the parser's "could not parse" notes, one per bad call

    verdicts, details = {}, {}
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for f in all_fixtures():
        v = verdict(f)
        verdicts[f.id], details[f.id] = v.status, v.detail
        counts[f.family][v.status] += 1

    cols = ("pass", "soft", "fail", "unsupported")
    print(f"{'family':<14}{'fixtures':>9}{'supported':>10}" + "".join(f"{c:>12}" for c in cols))
    total = collections.Counter()
    for fam in sorted(counts):
        c = counts[fam]
        total.update(c)
        n = sum(c.values())
        print(f"{fam:<14}{n:>9}{n - c['unsupported']:>10}" + "".join(f"{c[k]:>12}" for k in cols))
    n = sum(total.values())
    supported = n - total["unsupported"]
    print(f"{'total':<14}{n:>9}{supported:>10}" + "".join(f"{total[k]:>12}" for k in cols))
    ok = total["pass"] + total["soft"]
    print(f"\npass or soft: {ok}/{supported} supported, {ok}/{n} of all = {100 * ok / n:.1f} % "
          f"(goal >= 97 %)")

    if args.fails:
        for fid, status in sorted(verdicts.items()):
            if status == "fail":
                print(f"\n{fid}\n  {details[fid]}")
    if args.write_baseline:
        doc = {"_about": ABOUT, "canitoolcall": "0.1.1", "verdicts": dict(sorted(verdicts.items()))}
        BASELINE.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"\nwrote {BASELINE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
