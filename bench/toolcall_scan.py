"""What finding a call's end costs while a long call streams in: one ``write_file`` call
with an N-character argument, fed to the engine's parser (``OutputParser.for_format`` on
each family's format) in 4-character pieces, as a detokenizer hands them over. The call's
end is looked for after every piece, so a scan that starts over each time grows with N²;
a resuming one (kit/formats/base.py ``JsonMarkerEnd``, ``ScanMarks``) with N. Model-free.

    PYTHONPATH=. python bench/toolcall_scan.py [--sizes 4000,16000,64000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.formats.replay import family_format, replay  # noqa: E402

Q = '<|"|>'


def calls(body: str) -> dict[str, tuple[str, str, str]]:
    """family label -> (canitoolcall family, variant, the raw output of one call)."""
    args = json.dumps({"path": "a.txt", "content": body})
    return {
        "qwen3 json_tools": ("qwen3-hermes", "*", '<tool_call>\n{"name": "write_file", '
                             f'"arguments": {args}}}\n</tool_call>'),
        "qwen3_coder": ("qwen3-xml", "*", "<tool_call>\n<function=write_file>\n<parameter=path>"
                        f"\na.txt\n</parameter>\n<parameter=content>\n{body}\n</parameter>\n"
                        "</function>\n</tool_call>"),
        "glm47": ("glm", "*", "<tool_call>write_file<arg_key>path</arg_key><arg_value>a.txt"
                  "</arg_value><arg_key>content</arg_key><arg_value>"
                  f"{body}</arg_value></tool_call>"),
        "gemma4": ("gemma4", "*", f"<|tool_call>call:write_file{{path:{Q}a.txt{Q},content:{Q}"
                   f"{body}{Q}}}<tool_call|>"),
        "kimi_k2": ("kimi", "kimi-k2-thinking", "<|tool_calls_section_begin|><|tool_call_begin|>"
                    f"functions.write_file:0<|tool_call_argument_begin|>{args}<|tool_call_end|>"
                    "<|tool_calls_section_end|>"),
        "kimi_k3": ("kimi", "kimi-k3-xtml", '<|open|>tools<|sep|><|open|>call tool="write_file" '
                    'index="1"<|sep|><|open|>argument key="path" type="string"<|sep|>a.txt'
                    '<|close|>argument<|sep|><|open|>argument key="content" type="string"<|sep|>'
                    f"{body}<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4000,16000,64000")
    sizes = [int(s) for s in ap.parse_args().sizes.split(",")]
    line = 'print("a \\"quoted\\" </tag> {x}")\n'  # code: quotes, escapes, tag-like text
    rows: dict[str, list[str]] = {}
    for n in sizes:
        body = (line * (n // len(line) + 1))[:n]
        for label, (slug, variant, text) in calls(body).items():
            fmt = family_format(slug, variant)
            pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
            t = time.perf_counter()
            reply = replay(fmt, pieces)
            ms = 1000 * (time.perf_counter() - t)
            ok = reply.calls and reply.calls[0][1].get("content") == body
            rows.setdefault(label, []).append(f"{ms:10.0f}" if ok else f"{'WRONG':>10}")
    print(f"{'format':<18}" + "".join(f"{f'{n} chars':>12}" for n in sizes) + "   (ms)")
    for label, cells in rows.items():
        print(f"{label:<18}" + "".join(f"{c:>12}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
