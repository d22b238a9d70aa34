"""The engine worker's queue: requests, swaps and the shutdown marker, in order, plus the
cancellations of requests.

The worker reads it only through :class:`Inbox`'s methods, so a distributed engine can
replace it (:class:`kit.engine.distributed.rank_inbox.RankInbox`): there, what the worker observes here
(an arrival, a cancel, a timeout) is what rank 0 observed, broadcast at the same sync
points on every rank, so every rank makes the same model calls in the same order.
"""

from __future__ import annotations

import queue
from typing import Any

from kit.engine.decode.run import Job


#: :meth:`Inbox.next_is_job`'s default: a request for any adapter
ANY = object()


def is_job(item: object, adapter: object = ANY) -> bool:
    """Whether ``item`` is a request (with ``adapter``: one for that adapter)."""
    return isinstance(item, Job) and (adapter is ANY or item.request.adapter == adapter)


class Inbox:
    """A single process's queue (``queue.Queue``): items are seen as soon as they are put,
    cancels set the job's ``cancelled`` event at once, :meth:`sync` does nothing.

    Items: :class:`kit.engine.decode.run.Job`, :class:`kit.engine.decode.run.Swap`, or None (stop after
    what was queued before it).
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()

    def put(self, item: Any) -> None:
        """Queue ``item``; any thread."""
        self._queue.put(item)

    def cancel(self, job: Job) -> None:
        """Ask ``job`` to stop at its next token (or prefill chunk); any thread."""
        job.cancelled.set()

    def get(self, timeout: float | None = None) -> Any:
        """The next item, waiting at most ``timeout`` seconds (None: no limit); worker only.

        Raises:
            queue.Empty: nothing arrived in ``timeout`` seconds.
        """
        return self._queue.get(timeout=timeout)

    def get_nowait(self) -> Any:
        """The next item if one is there (as of the last :meth:`sync`); worker only.

        Raises:
            queue.Empty: nothing is queued.
        """
        return self._queue.get_nowait()

    def empty(self) -> bool:
        """Whether nothing is queued (as of the last :meth:`sync`)."""
        return self._queue.empty()

    def next_is_job(self, adapter: object = ANY) -> bool:
        """Whether a request (not a swap or the shutdown) is at the queue's head; with
        ``adapter``, one for that adapter (None: the base model)."""
        with self._queue.mutex:
            return bool(self._queue.queue) and is_job(self._queue.queue[0], adapter)

    def sync(self) -> None:
        """A sync point of the worker (each decode step, each prefill chunk): where a
        distributed inbox takes in what rank 0 saw since the last one. Nothing here."""
