"""The distributed engine's queue: every rank's worker sees what rank 0's queue saw, at
the same sync points, so every rank runs the same requests, steps and swaps.

Rank 0's pipe thread puts requests and cancels as in a single process; nothing reaches
the worker until a sync point (:meth:`RankInbox.sync`, each decode step and prefill
chunk, or a wait for work in :meth:`RankInbox.get`), where rank 0 shares what arrived
since the last one (:meth:`kit.engine.distributed.world.World.share`) and every rank appends the same
items to its own copy of the queue and sets the same cancel flags. What the worker then
reads (:meth:`get_nowait`, :meth:`empty`, :meth:`next_is_job`, ``job.cancelled``) is the
same on every rank.

While there is no work, every rank syncs at ticks that start at 5 ms after the last work
and double up to :data:`IDLE_TICK_S` seconds (an agent's next turn often follows at
once; an idle server settles at a few syncs a second), and between
two syncs the followers sleep instead of waiting inside the collective: a rank waiting in
a ring ``all_sum`` polls its sockets (measured here: 57% of a core per waiting rank), so
an idle server whose followers waited there would keep a core busy per rank. The cost is
up to one tick before a request reaches the followers. The ticks also let a peer that is
gone be noticed while idle and feed the watchdogs. Imported only in rank processes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from kit.engine.decode.bridge import END
from kit.engine.decode.inbox import ANY, Inbox, is_job
from kit.engine.decode.run import Job, Swap
from kit.engine.distributed.world_codec import Arrivals, Gen, Stop, SwapTo

if TYPE_CHECKING:  # it imports mlx; this module is tested without
    from kit.engine.distributed.world import World

IDLE_TICK_S = 0.2  # most seconds between syncs while there is no work (see the docstring)
_FIRST_TICK_S = 0.005  # the first idle tick; each next one doubles, up to IDLE_TICK_S


def _wire(item: Any) -> Any:
    if isinstance(item, Job):
        return Gen(jid=item.jid, request=item.request)
    if isinstance(item, Swap):
        return SwapTo(spec=item.spec)
    return Stop()


class RankInbox(Inbox):
    """:class:`kit.engine.decode.inbox.Inbox` shared by every rank of ``world``: rank 0's
    :meth:`put` and :meth:`cancel` (its pipe thread) take effect on every rank at the
    next sync point. Followers' jobs post their events nowhere (rank 0 answers the
    client) and their swaps reply to no one.

    Args:
        world: the group (:class:`kit.engine.distributed.world.World`).
    """

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self._mirror: deque[Any] = deque()  # the queue as every rank sees it
        self._jobs: dict[int, Job] = {}  # queued or running jobs, by jid (for cancels)
        self._cancels: list[int] = []
        self._lock = threading.Lock()

    # -- rank 0's pipe thread ----------------------------------------------------------------

    def put(self, item: Any) -> None:
        """Queue ``item`` (rank 0; any thread); every rank sees it at the next sync."""
        if isinstance(item, Job):
            post = item.sink

            def sink(event: Any, jid: int = item.jid) -> None:
                if event is END:
                    self._jobs.pop(jid, None)
                post(event)
            item.sink = sink
        self._queue.put(item)

    def cancel(self, job: Job) -> None:
        """Cancel ``job`` on every rank at the next sync point (rank 0; any thread)."""
        with self._lock:
            self._cancels.append(job.jid)

    # -- the worker, on every rank -----------------------------------------------------------

    def _update(self, wait: float | None, deadline: float | None = None) -> bool:
        """One sync: rank 0 takes what arrived (waiting up to ``wait`` seconds for a first
        item when ``wait`` is given), shares it, and every rank applies it. Returns
        whether rank 0 found nothing by ``deadline`` (``time.monotonic()``; the caller's
        timeout ran out), as rank 0 decided it."""
        world, local, payload = self.world, [], None
        if world.rank == 0:
            # cancels first: one that arrives while the queue is drained then names a job
            # this update or a later one delivers, never one already dropped as unknown
            with self._lock:
                cancels, self._cancels = self._cancels, []
            if wait is not None:
                world.idle = True
                try:
                    local.append(self._queue.get(timeout=wait))
                except queue.Empty:
                    pass
                finally:
                    world.idle = False
            while True:
                try:
                    local.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            timed_out = not local and deadline is not None and time.monotonic() >= deadline
            if local or cancels or timed_out:
                payload = Arrivals(items=[_wire(i) for i in local], cancels=cancels,
                                   timed_out=timed_out)
        payload = world.share(Arrivals, payload)
        if payload is None:
            return False
        cancels, timed_out = payload.cancels, payload.timed_out
        items = local if world.rank == 0 else [self._local(w) for w in payload.items]
        for item in items:
            if isinstance(item, Job):
                self._jobs[item.jid] = item
        self._mirror.extend(items)
        for jid in cancels:
            job = self._jobs.get(jid)
            if job is not None:
                job.cancelled.set()
        return timed_out

    def _local(self, wire: Any) -> Any:
        """A follower's copy of a queue item rank 0 shared (a
        :mod:`kit.engine.distributed.world_codec` ``Gen``, ``SwapTo`` or ``Stop``)."""
        if isinstance(wire, Gen):
            jid = wire.jid

            def sink(event: Any) -> None:
                if event is END:
                    self._jobs.pop(jid, None)
            return Job(wire.request, sink, jid=jid)
        if isinstance(wire, SwapTo):
            return Swap(wire.spec, lambda result, error: None)
        return None

    def sync(self) -> None:
        """Take in what rank 0 saw since the last sync (collective: every rank calls it
        at the same point of the same work)."""
        self._update(None)

    def get(self, timeout: float | None = None) -> Any:
        """The next item, waiting for one (a sync every :data:`IDLE_TICK_S` seconds
        meanwhile).

        Raises:
            queue.Empty: ``timeout`` seconds passed on rank 0 with nothing queued.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        ticks = 0  # every rank counts the same ticks: they sleep the same lengths
        while not self._mirror:
            tick = min(IDLE_TICK_S, _FIRST_TICK_S * 2 ** ticks)
            ticks = min(ticks + 1, 16)  # 2 ** ticks unbounded overflowed after ~200 s idle
            wait = None
            if self.world.rank == 0:
                wait = tick if deadline is None else \
                    max(0.0, min(tick, deadline - time.monotonic()))
            else:  # rank 0 waits as long on its queue: both reach the collective together
                self.world.idle = True
                time.sleep(tick)
                self.world.idle = False
            if self._update(wait, deadline):
                raise queue.Empty
        return self._mirror.popleft()

    def get_nowait(self) -> Any:
        """The next item as of the last sync.

        Raises:
            queue.Empty: nothing is queued.
        """
        if not self._mirror:
            raise queue.Empty
        return self._mirror.popleft()

    def empty(self) -> bool:
        """Whether nothing is queued, as of the last sync."""
        return not self._mirror

    def next_is_job(self, adapter: object = ANY) -> bool:
        """Whether a request (with ``adapter``: for that adapter) is at the queue's head,
        as of the last sync."""
        return bool(self._mirror) and is_job(self._mirror[0], adapter)
