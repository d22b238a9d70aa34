"""tests/greedy.py's rule: texts computed with other numerics may leave the reference
only at a near-tie of the reference's, never at a clear lead (model-free but for the last
test, which reads the leads off a real server)."""

from __future__ import annotations

import pytest

from tests.greedy import (TIE, Step, assert_agrees, check_agreement, departure, greedy_steps,
                          leaves_at_a_tie)

PARIS = [Step("The", 9.0), Step(" capital", 7.5), Step(" of", 12.0), Step(" France", 3.0),
         Step(" is", 0.01), Step(" Paris", 6.0), Step(".", 4.0)]
TEXT = "The capital of France is Paris."


def where(got: str) -> tuple[int, bool] | None:
    d = departure(TEXT, got, PARIS)
    return d and (d[0], leaves_at_a_tie(PARIS, d[0]))


def test_the_same_text_has_no_departure():
    assert departure(TEXT, TEXT, PARIS) is None


def test_leaving_at_a_near_tie_is_allowed_whatever_follows():
    assert where("The capital of France was the city of") == (4, True)


def test_leaving_at_a_clear_lead_is_not_allowed():
    assert where("L'Étoile, la Marseillaise,") == (0, False)  # the first step leads by 9
    assert where("The capital of Spain is Madrid.") == (3, False)


def test_a_token_that_starts_like_the_reference_one_is_judged_at_the_step_before():
    # " Paris" vs " Parisian": the second passes step 5's text and leaves at step 6, whose
    # lead is clear, but step 5 is the one that differs (its lead 6.0 is clear too)
    assert where("The capital of France is Parisian") == (6, False)
    ties = PARIS[:5] + [Step(" Paris", 0.002), Step(".", 4.0)]
    d = departure(TEXT, "The capital of France is Parisian", ties)
    assert d and leaves_at_a_tie(ties, d[0])


def test_an_answer_that_stops_early_or_runs_past_the_end_is_a_departure():
    assert where("The capital of France") == (4, True)  # stopped at the near-tie
    assert where("The capital") == (2, False)
    assert departure(TEXT, TEXT + " It is", PARIS)[0] == len(PARIS)


def test_the_tie_is_well_above_f32_reordering_and_well_below_a_clear_lead():
    assert 1e-3 < TIE < 0.5


def test_check_agreement_asks_the_reference_only_when_the_texts_differ():
    asked = []

    def reference():
        asked.append(1)
        return TEXT, PARIS

    check_agreement(TEXT, TEXT, reference)
    assert not asked
    check_agreement(TEXT, "The capital of France was", reference)  # leaves at the tie
    assert asked
    with pytest.raises(AssertionError, match="clear lead"):
        check_agreement(TEXT, "L'Étoile", reference)
    with pytest.raises(AssertionError, match="empty"):
        check_agreement(TEXT, "", reference)


def test_a_rerun_of_the_reference_may_part_from_the_expected_text_only_at_a_tie():
    rerun = ("The capital of France was", PARIS[:4] + [Step(" was", 0.01)])
    check_agreement(TEXT, "The capital of France was", lambda: rerun)
    with pytest.raises(AssertionError, match="the expected answer departs"):
        check_agreement("The capital of Spain", "The capital of France",
                        lambda: (TEXT, PARIS))


def test_the_servers_logprobs_give_the_steps_of_its_greedy_answer(server):
    # the real server path: the steps' texts make up the answer, each with a lead, and a
    # text that leaves at a clear lead fails (France's first step leads by ~0.1 nats)
    france = [{"role": "user", "content": "What is the capital of France?"}]
    text, steps, finish = greedy_steps(server, france, 10)
    assert text == "".join(s.text for s in steps) == "The capital of France is Paris."
    assert finish == "stop" and all(s.lead is not None and s.lead >= 0 for s in steps)
    assert TIE < steps[0].lead < 1.0
    assert_agrees(server, france, text, text, max_tokens=10)
    with pytest.raises(AssertionError, match="clear lead"):
        assert_agrees(server, france, text, "L'Étoile, la Marseillaise,", max_tokens=10)
