"""canitoolcall 0.1.1's 469 recorded model outputs replayed through mlx-kit's parser entry
point (``OutputParser.for_format``, the parser built as the engine builds it: see
tests/conformance/adapter.py), whole and at text-level stream splits, judged by
canitoolcall's own checks and ``assert_conforms``.

Many fixtures fail or are unsupported today (issue 14). ``baseline.json`` is the progress
record toward issue 14's >= 97 % goal, not an allow-list: each fixture must do at least as
well as recorded there (pass < soft < fail < unsupported), so a parser fix moves its entries
up and a regression fails here. Model-free: no model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from canitoolcall.pytest_plugin import assert_conforms, assert_equivalent

from tests.conformance.adapter import _format, all_fixtures, rank, verdict

BASELINE_FILE = Path(__file__).with_name("baseline.json")
BASELINE: dict[str, str] = json.loads(BASELINE_FILE.read_text(encoding="utf-8"))["verdicts"]
FIXTURES = all_fixtures()


def test_the_baseline_records_every_fixture_of_the_suite():
    assert len(FIXTURES) == 469
    assert set(BASELINE) == {f.id for f in FIXTURES}
    assert set(BASELINE.values()) <= {"pass", "soft", "fail", "unsupported"}


def test_each_family_gets_the_format_mlx_kits_selection_picks():
    """What the replay runs: mlx-kit's selection on each family's template and vocab. A
    change here (an mlx-lm upgrade, a parser of our own) should come with a new baseline."""
    picks = {(slug, variant): (_format(slug, variant).tool_format if _format(slug, variant).tools
                               else None, _format(slug, variant).think)
             for slug, variant in [
        ("qwen3-hermes", "*"), ("qwen3-xml", "*"), ("glm", "*"), ("mistral", "*"), ("gemma4", "*"),
        ("kimi", "kimi-k2-thinking"), ("kimi", "kimi-k2-instruct"), ("kimi", "kimi-k3-xtml"),
        ("deepseek", "*"), ("deepseek", "deepseek-v3"), ("deepseek", "deepseek-v31"),
        ("deepseek", "deepseek-v32"), ("deepseek", "deepseek-v4"), ("deepseek", "deepseek-v41"),
        ("gpt-oss", "*"), ("llama", "llama3-json"), ("llama", "llama4-pythonic")]}
    think = ("<think>", "</think>")
    assert picks == {
        ("qwen3-hermes", "*"): ("json_tools", think), ("qwen3-xml", "*"): ("qwen3_coder", think),
        ("glm", "*"): ("glm47", think), ("mistral", "*"): ("mistral", ("[THINK]", "[/THINK]")),
        ("gemma4", "*"): ("gemma4", ("<|channel>thought", "<channel|>")),
        ("kimi", "kimi-k2-thinking"): ("kimi_k2", think), ("kimi", "kimi-k2-instruct"): ("kimi_k2", None),
        ("kimi", "kimi-k3-xtml"): ("kimi_k3", ("<|open|>think<|sep|>", "<|close|>think<|sep|>")),
        **{("deepseek", v): ("deepseek", think) for v in
           ("*", "deepseek-v3", "deepseek-v31", "deepseek-v32", "deepseek-v4", "deepseek-v41")},
        ("gpt-oss", "*"): ("harmony", None),
        ("llama", "llama3-json"): ("llama3_json", None),
        ("llama", "llama4-pythonic"): ("llama3_json", None)}


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.id for f in FIXTURES])
def test_fixture_parses_no_worse_than_its_baseline(fixture):
    was = BASELINE[fixture.id]
    got = verdict(fixture)
    assert rank(got.status) <= rank(was), (
        f"{fixture.id} got worse: {was} -> {got.status}: {got.detail}")
    if got.status in ("pass", "soft"):
        # canitoolcall's own assertion on the non-streamed parse, and every text-level
        # stream split equal to it (streaming must equal non-streaming)
        assert_conforms(fixture, got.nonstream, soft=got.status == "soft")
        for label, streamed in got.streams.items():
            try:
                assert_equivalent(got.nonstream, streamed)
            except AssertionError as e:
                raise AssertionError(f"{fixture.id}, stream split {label}: {e}") from None
