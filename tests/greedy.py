"""Comparing greedy answers that were computed with different numerics.

Two greedy runs of one model agree token for token only while each step's winner leads
the runner-up by more than the numerical difference between the two computations. Where
the computation differs (3 ranks vs one process, a batch vs alone, a prompt-cache hit vs a
cold prefill, another BLAS kernel on another machine), that difference is a few 1e-4 of a
logit for the f32 starter, and which way a near-tie falls depends on the machine. So such
tests assert :func:`assert_agrees`: the texts are equal, or equal up to a step where the
reference's top two tokens are within :data:`TIE` of each other, and free after it. A
wrong shard, a stale cache entry or a request that read another's KV departs at a step
with a clear lead (usually the first), and fails.

Where the computation is the same (the same server and request, repeated) tests still
assert plain equality.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import httpx

# In nats (a logit difference). 100x what f32 reorderings move the starter's logits
# (measured: 3 ranks vs one process, batched vs alone, below 3e-4), and far below the
# lead of a step a broken computation changes.
TIE = 0.05
# For two runs that both quantize their KV cache: a value that sits on a rounding boundary
# rounds to another step when the last bits move, so such runs part by more. Measured: the
# starter's first-step logprobs under 8-bit KV move by up to 0.16 nats across six BLAS
# kernels (tests/server/test_kv_bits.py holds them to 0.5 of full precision's).
TIE_QUANTIZED = 0.5


@dataclass(frozen=True)
class Step:
    """One greedy step of the reference: the token's text and its lead over the
    runner-up in nats (None when the server sent fewer than two alternatives)."""
    text: str
    lead: float | None


def greedy_steps(server: Any, messages: list[dict], max_tokens: int,
                 **body: Any) -> tuple[str, list[Step], str]:
    """The reference's greedy answer to ``messages`` as (text, steps, finish_reason),
    from one chat completion with ``logprobs`` and 2 ``top_logprobs`` per step."""
    r = httpx.post(server.v1 + "/chat/completions", timeout=240, json={
        "model": "local", "messages": messages, "max_tokens": max_tokens,
        "temperature": 0, "logprobs": True, "top_logprobs": 2, **body})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    steps = []
    for entry in (choice.get("logprobs") or {}).get("content") or ():
        top = entry["top_logprobs"]
        lead = top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else None
        steps.append(Step(entry["token"], lead))
    return choice["message"]["content"] or "", steps, choice["finish_reason"]


def departure(expected: str, got: str, steps: list[Step]) -> tuple[int, str] | None:
    """Where ``got`` leaves ``expected`` (the reference's text, made of ``steps``): the
    step's index and why it may or may not leave there, or None when ``got`` follows
    every step. Pure (for tests of this helper)."""
    pos = 0
    for i, step in enumerate(steps):
        end = pos + len(step.text)
        if got[pos:end] == step.text:
            pos = end
            continue
        # A different token whose text starts like this one's passes the check above and
        # shows one step later: the tie may be at the step before.
        leads = [s.lead for s in steps[max(0, i - 1):i + 1] if s.lead is not None]
        tie = min(leads, default=None)
        return i, (f"after {expected[:pos]!r} the reference wrote {step.text!r}, this "
                   f"wrote {got[pos:pos + 24]!r}; the reference's lead there: "
                   + (f"{tie:.4f} nats" if tie is not None else "unknown"))
    if got != expected:
        return len(steps), (f"this continues past the reference's end: "
                            f"{got[len(expected):][:24]!r} (the lead there is unknown)")
    return None


def leaves_at_a_tie(steps: list[Step], index: int, tie: float = TIE) -> bool:
    """True when step ``index`` (or the one before it) is a near-tie of the reference."""
    return any(s.lead is not None and s.lead < tie for s in steps[max(0, index - 1):index + 1])


def check_agreement(expected: str, got: str,
                    reference: Callable[[], tuple[str, list[Step]]], tie: float = TIE) -> None:
    """Assert ``got`` is ``expected`` computed with other numerics: equal, or equal up to a
    step where the reference's winner leads by less than ``tie`` nats, and free after it.

    ``reference()`` gives the reference's (text, steps) again, with each step's lead; it is
    called only when the two differ. Both ``expected`` and ``got`` are then held against
    it: a rerun of the reference is the same computation as ``expected`` up to the prompt
    cache's prefixes (which move the last bits too), so it may itself part from
    ``expected``, but only at a near-tie.

    Raises:
        AssertionError: ``got`` is empty, or ``got`` or ``expected`` departs from the
            reference's steps at a clear lead.
    """
    assert got, "an empty answer"
    if got == expected:
        return
    text, steps = reference()
    for name, candidate in (("the expected answer", expected), ("the answer", got)):
        where = departure(text, candidate, steps)
        if where is not None:
            index, why = where
            assert leaves_at_a_tie(steps, index, tie), (
                f"{name} departs from the reference at a clear lead: {why}")


def assert_agrees(reference: Any, messages: list[dict], expected: str, got: str, *,
                  max_tokens: int, tie: float = TIE, **body: Any) -> None:
    """:func:`check_agreement` of ``got`` with ``expected``, the greedy answer that
    ``reference`` (a server) gave to ``messages`` as one chat completion of ``max_tokens``
    (``body``: more of its fields); asked again with logprobs only when the two differ."""
    check_agreement(expected, got,
                    lambda: greedy_steps(reference, messages, max_tokens, **body)[:2], tie)
