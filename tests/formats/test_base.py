"""The call-end scanners families share (kit/formats/base.py), against plain oracles on
every prefix of generated texts; model-free."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kit.formats.base import (
    Broken,
    JsonMarkerEnd,
    More,
    ScanMarks,
    is_cut,
    schema_types,
    skip_ws,
    structure_end,
)
from tests.formats.replay import reference_json_end

ENDS = ("<|call|>", "<|end|>", "<|return|>")  # Harmony's call ends: one first character
PIECES = st.sampled_from(['"', "\\", "<", "<|", "<|call|>", "<|end|>", "<|ret", "<|return|>",
                          "a", " ", "{", "}", '\\"', "é", "|>"])


@given(st.lists(PIECES, max_size=40))
@settings(max_examples=300, deadline=None)
def test_a_scan_for_several_markers_answers_as_the_plain_loop_on_every_prefix(pieces):
    text, resuming = "".join(pieces), JsonMarkerEnd(*ENDS)
    for i in range(len(text) + 1):  # one instance fed the growing text, as a parser does
        want = reference_json_end(text[:i], ENDS)
        assert resuming(text[:i]) == want == JsonMarkerEnd(*ENDS)(text[:i]), text[:i]


def test_markers_with_different_first_characters_are_each_found_outside_strings():
    scan = JsonMarkerEnd("</x>", "[END]")
    assert scan('{"a": "[END] </x>"} [END]') == (20, 25)
    assert JsonMarkerEnd("</x>", "[END]")('{"a": "[END]"} </x>') == (15, 19)
    assert JsonMarkerEnd("</x>", "[END]")('{"a": "</x>') is None


def test_a_marker_cut_at_the_end_of_the_text_waits_for_the_next_text():
    scan = JsonMarkerEnd("<|call|>")
    assert scan('{"a": 1}<|ca') is None
    assert scan('{"a": 1}<|call|>') == (8, 16)


def test_scan_marks_start_over_when_a_text_does_not_extend_the_last():
    marks = ScanMarks()
    marks("<a>long value")[3] = 10
    assert marks("<a>long value and more") == {3: 10}
    assert marks("<b>other") == {}


def test_the_structure_scan_helpers():
    assert skip_ws(" \t\n x", 0) == 4 and skip_ws("   ", 1) == 3
    assert is_cut("ab</par", 2, ("</parameter>",)) and is_cut("ab", 2, ("</x>",))
    assert not is_cut("ab</x> ", 2, ("</x>",)) and not is_cut("abc", 2, ("</x>",))
    assert schema_types({"type": ["Integer", "null"]}) == ["integer", "null"]
    assert schema_types({"anyOf": [{"type": "string"}, {"oneOf": [{"type": "number"}]}]}) == \
        ["string", "number"]
    assert schema_types({"description": "anything"}) == []


def test_a_broken_structure_ends_at_the_first_end_marker_after_where_it_broke():
    def scan(exc):
        def run():
            raise exc
        return run

    assert structure_end(lambda: (3, 7), "abc</x>", "</x>") == (3, 7)
    assert structure_end(scan(More()), "abc", "</x>") is None
    assert structure_end(scan(Broken(4)), "</x>a</x>b", "</x>") == (5, 9)
    assert structure_end(scan(Broken(1)), "a</", "</x>") is None
