"""RankInbox: every rank's worker sees the same queue, cancels and timeouts, at the same
sync points, whatever the timing of rank 0's arrivals. Model-free: threads stand in for
ranks, and a barrier for mx.distributed's all_sum (the real collectives are exercised by
tests/distributed/ over real ring ranks)."""

from __future__ import annotations

import queue
import random
import threading
import time

import pytest

from kit.engine.decode.bridge import END
from kit.engine.distributed.rank_inbox import RankInbox
from kit.engine.decode.run import Job, Swap
from kit.engine.distributed import world_codec as codec
from kit.engine.types import ChatRequest

_KEY = bytes(32)


class _Hub:
    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size, timeout=20)
        self.slot = b""


class FakeWorld:
    """World's interface over threads: ``share`` is a broadcast through a barrier."""

    def __init__(self, hub: _Hub, rank: int, size: int) -> None:
        self.hub, self.rank, self.size = hub, rank, size
        self.idle = False
        self.shares = 0

    def share(self, kind, record=None, root: int = 0):
        # the real World's frames (kit.engine.distributed.world_codec), through a barrier
        if self.rank == root:
            self.hub.slot = b"" if record is None else \
                codec.encode(_KEY, self.shares, root, record)
        self.hub.barrier.wait()
        data = self.hub.slot
        self.hub.barrier.wait()
        seq, self.shares = self.shares, self.shares + 1
        if self.rank == root or not data:
            return record
        return codec.decode(_KEY, seq, root, kind, data)


def _request(text: str) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}])


def _worlds(size: int) -> list[RankInbox]:
    hub = _Hub(size)
    return [RankInbox(FakeWorld(hub, r, size)) for r in range(size)]


def _worker(inbox: RankInbox, trace: list, steps: int, ttl: float | None) -> None:
    """What the engine's worker observes, in order: each item, then per decode step
    whether it was cancelled and whether a request waits next."""
    while True:
        try:
            item = inbox.get(timeout=ttl)
        except queue.Empty:
            trace.append(("timeout",))
            continue
        if item is None:
            trace.append(("stop",))
            return
        if isinstance(item, Swap):
            trace.append(("swap", item.spec))
            continue
        trace.append(("job", item.jid, item.request.messages[0]["content"]))
        for _ in range(steps):
            inbox.sync()
            trace.append(("step", item.jid, item.cancelled.is_set(), inbox.next_is_job()))
            if item.cancelled.is_set():
                break
        while not inbox.empty() and inbox.next_is_job():  # a batch admits what waits
            joined = inbox.get_nowait()
            trace.append(("joined", joined.jid))
            joined.post(END)
        item.post(END)


def _run(size: int, feed, steps: int = 5, ttl: float | None = None) -> list[list]:
    inboxes = _worlds(size)
    traces: list[list] = [[] for _ in range(size)]
    threads = [threading.Thread(target=_worker, args=(inboxes[r], traces[r], steps, ttl),
                                daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    feed(inboxes[0])
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return traces


def test_every_rank_sees_the_same_arrivals_cancels_and_steps_whatever_the_timing():
    rng = random.Random(7)
    events: list[list] = []

    def feed(inbox: RankInbox) -> None:
        jobs = []
        for jid in range(1, 13):
            job = Job(_request(f"q{jid}"), lambda item, jid=jid: events.append((jid, item)),
                      jid=jid)
            jobs.append(job)
            inbox.put(job)
            if jid % 4 == 0:
                inbox.put(Swap(f"model-{jid}", lambda r, e: None))
            time.sleep(rng.uniform(0, 0.01))
            if rng.random() < 0.4:  # rank 0's pipe thread cancels at any moment
                inbox.cancel(rng.choice(jobs))
        time.sleep(0.05)
        inbox.put(None)

    traces = _run(3, feed)
    assert traces[0] == traces[1] == traces[2]
    served = {e[1] for e in traces[0] if e[0] == "job"} | {
        e[1] for e in traces[0] if e[0] == "joined"}
    assert served == set(range(1, 13))  # every request ran (or joined) exactly once
    assert [e[1] for e in traces[0] if e[0] == "swap"] == ["model-4", "model-8", "model-12"]
    assert traces[0][-1] == ("stop",)
    # rank 0's own jobs kept their sinks: each request's END reached its caller once
    assert sorted(j for j, item in events if item is END) == list(range(1, 13))


def test_a_cancel_reaches_every_rank_at_the_same_step():
    def feed(inbox: RankInbox) -> None:
        job = Job(_request("long"), lambda item: None, jid=1)
        inbox.put(job)
        time.sleep(0.05)
        inbox.cancel(job)
        time.sleep(0.05)
        inbox.put(None)

    traces = _run(3, feed, steps=10_000)
    assert traces[0] == traces[1] == traces[2]
    steps = [e for e in traces[0] if e[0] == "step"]
    assert steps[-1][2] is True and not any(e[2] for e in steps[:-1])
    assert len(steps) < 10_000  # it stopped at the cancel, not at the end


def test_the_idle_timeout_fires_on_every_rank_together_and_only_when_nothing_came():
    def feed(inbox: RankInbox) -> None:
        time.sleep(0.5)  # past the TTL: one timeout
        inbox.put(Job(_request("after"), lambda item: None, jid=1))
        time.sleep(0.05)
        inbox.put(None)

    traces = _run(2, feed, ttl=0.3)
    assert traces[0] == traces[1]
    kinds = [e[0] for e in traces[0]]
    assert kinds.count("timeout") == 1
    assert kinds.index("timeout") < kinds.index("job")


def test_followers_sleep_between_idle_syncs_instead_of_waiting_in_a_collective():
    # an idle second costs a few syncs (ticks double from 5 ms to 0.2 s), not hundreds
    inboxes = _worlds(2)
    done = threading.Event()

    def follower() -> None:
        try:
            inboxes[1].get()
        finally:
            done.set()
    t = threading.Thread(target=follower, daemon=True)
    t.start()
    leader = threading.Thread(target=lambda: inboxes[0].get(), daemon=True)
    leader.start()
    time.sleep(1.0)
    syncs = inboxes[1].world.shares
    assert 3 <= syncs <= 15, syncs
    inboxes[0].put(None)
    t.join(5)
    assert done.is_set()


@pytest.mark.parametrize("size", [2, 4])
def test_followers_jobs_post_nowhere_and_are_forgotten_when_they_end(size):
    def feed(inbox: RankInbox) -> None:
        for jid in (1, 2):
            inbox.put(Job(_request(f"q{jid}"), lambda item: None, jid=jid))
        time.sleep(0.05)
        inbox.put(None)

    inboxes = _worlds(size)
    traces: list[list] = [[] for _ in range(size)]
    threads = [threading.Thread(target=_worker, args=(inboxes[r], traces[r], 2, None),
                                daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    feed(inboxes[0])
    for t in threads:
        t.join(30)
    assert all(tr == traces[0] for tr in traces)
    assert all(not ib._jobs for ib in inboxes)  # no request outlives its END on any rank


def test_an_idle_inbox_keeps_ticking_past_a_thousand_ticks(monkeypatch):
    # the tick doubled as 5 ms * 2 ** n with n unbounded: at n = 1024 the float overflowed
    # (OverflowError on every rank after ~200 s idle, ending an idle server)
    import kit.engine.distributed.rank_inbox as rank_inbox

    monkeypatch.setattr(rank_inbox, "IDLE_TICK_S", 1e-5)
    monkeypatch.setattr(rank_inbox, "_FIRST_TICK_S", 1e-7)
    inboxes = _worlds(2)
    got: list = []
    threads = [threading.Thread(target=lambda ib=ib: got.append(ib.get()), daemon=True)
               for ib in inboxes]
    for t in threads:
        t.start()
    from tests.helpers import wait_until

    wait_until(lambda: inboxes[1].world.shares > 1200, timeout=60)
    inboxes[0].put(None)
    for t in threads:
        t.join(10)
    assert got == [None, None]


def test_a_cancel_right_after_its_request_is_never_lost():
    # the pipe thread puts a job and cancels it at once, while rank 0 drains its queue:
    # however they interleave, every rank sees the job cancelled
    for attempt in range(30):
        def feed(inbox: RankInbox, attempt=attempt) -> None:
            job = Job(_request("x"), lambda item: None, jid=1)
            time.sleep(random.Random(attempt).uniform(0, 0.01))
            inbox.put(job)
            inbox.cancel(job)
            time.sleep(0.05)
            inbox.put(None)

        traces = _run(2, feed, steps=100_000)
        assert traces[0] == traces[1]
        steps = [e for e in traces[0] if e[0] == "step"]
        assert steps and steps[-1][2] is True, attempt
