"""What the ranks' authenticated encoding (kit/engine/distributed/world_codec.py) costs: per share,
the sender's encode and length tag plus one follower's length check and decode, for the
shares a world makes (an idle tick or a decode step with nothing new: the empty share;
one request; an agent's long prompt; a rank's facts), next to the pickle the shares were
before (no MAC). And per decode step, the share every step makes while requests run
(usually empty), as a share of a decode step's time on 3 CPU ranks (~0.5-1 s here) and
at 100 tok/s. Model-free; CPU time of this process, median of repeats.

    python bench/world_mac.py
"""

from __future__ import annotations

import os
import pickle
import statistics
import time

from kit.engine.distributed import world_codec as codec
from kit.engine.types import ChatRequest, SamplingParams
from kit.engine.distributed.world_codec import Arrivals, Gen, RankFacts

KEY = os.urandom(32)


def _median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _request(chars: int) -> ChatRequest:
    text = ("The quick brown fox jumps over the lazy dog. " * (chars // 45 + 1))[:chars]
    return ChatRequest(messages=[{"role": "system", "content": "You are a coding agent."},
                                 {"role": "user", "content": text}],
                       params=SamplingParams(max_tokens=256, temperature=0.0),
                       tools=[{"type": "function",
                               "function": {"name": f"tool{i}", "parameters": {}}}
                              for i in range(20)])


def _share(record) -> None:
    """The codec's work for one share of ``record`` (None: empty), sender and follower."""
    frame = b"" if record is None else codec.encode(KEY, 7, 0, record)
    tag = codec.length_tag(KEY, 7, 0, len(frame))
    codec.check_length(KEY, 7, 0, len(frame), tag, Arrivals if record is None
                       else type(record))
    if record is not None:
        codec.decode(KEY, 7, 0, type(record), frame)


def _pickled(record) -> None:
    if record is not None:
        pickle.loads(pickle.dumps(record))


def main() -> None:
    cases = [
        ("empty (idle tick, decode step)", None, 20000),
        ("one chat request (200 chars)", Arrivals(items=[Gen(jid=1, request=_request(200))],
                                                  cancels=[], timed_out=False), 3000),
        ("agent prompt (100 KB)", Arrivals(items=[Gen(jid=1, request=_request(100_000))],
                                           cancels=[], timed_out=False), 300),
        ("agent prompt (1 MB)", Arrivals(items=[Gen(jid=1, request=_request(1_000_000))],
                                         cancels=[], timed_out=False), 40),
        ("a rank's facts (/health)", RankFacts(rank=1, host="10.0.0.2", hostname="mac2",
                                               pid=4711, memory={"active_bytes": 1 << 30,
                                                                 "peak_bytes": 2 << 30,
                                                                 "weights_bytes": 1 << 29}),
         3000),
    ]
    print(f"{'share':34} {'frame bytes':>11} {'codec+MAC us':>13} {'pickle us':>10}")
    empty_us = 0.0
    for name, record, repeat in cases:
        size = 16 if record is None else len(codec.encode(KEY, 0, 0, record))
        us = _median_us(lambda: _share(record), repeat)
        base = _median_us(lambda: _pickled(record), repeat)
        empty_us = empty_us or us
        print(f"{name:34} {size:>11,} {us:>13.1f} {base:>10.1f}")
    print()
    print(f"{'per decode step (one empty share)':34} {'us':>8} {'of a step':>12}")
    for label, step_s in (("3 CPU ranks here (~0.7 s/step)", 0.7), ("at 100 tok/s", 0.01)):
        print(f"{label:34} {empty_us:>8.1f} {empty_us / (step_s * 1e6):>12.4%}")


if __name__ == "__main__":
    main()
