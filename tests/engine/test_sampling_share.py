"""kit/engine/decode/sampling.py hands requests with the same sampling settings the same
sampler object: mlx-lm's BatchGenerator samples a batch in one call only when its rows
share it (else a slice, a sampler call and a concatenate per row and step)."""

from __future__ import annotations

from kit.engine.decode.sampling import MAX_SAMPLERS, Sampling
from kit.engine.types import SamplingParams


def test_requests_with_the_same_settings_share_one_sampler_object():
    s = Sampling(slot=None)  # type: ignore[arg-type]  (samplers need no model)
    greedy = s.sampler(SamplingParams(temperature=0))
    assert s.sampler(SamplingParams(temperature=0, max_tokens=5, seed=3)) is greedy
    hot = s.sampler(SamplingParams(temperature=0.7, top_p=0.9))
    assert hot is not greedy
    assert s.sampler(SamplingParams(temperature=0.7, top_p=0.9)) is hot
    assert s.sampler(SamplingParams(temperature=0.7, top_p=0.8)) is not hot


def test_the_shared_samplers_are_bounded_however_many_settings_clients_send():
    s = Sampling(slot=None)  # type: ignore[arg-type]
    for i in range(3 * MAX_SAMPLERS):
        s.sampler(SamplingParams(temperature=0.5 + i / 1000))
    assert len(s._samplers) <= MAX_SAMPLERS
