"""From the engine's worker thread to an asyncio consumer: events and one-shot replies.

The worker (a plain thread, or the engine process's pipe reader) never touches the event
loop directly: it calls a :class:`LoopSink` (a request's events) or the callable from
:func:`settle_from_thread` (a swap's or a call's result). Both are used in-process
(:mod:`kit.engine.decode.engine`) and by the server's end of the pipe (:mod:`kit.engine.proc.process`).
Own code: asyncio has ``run_coroutine_threadsafe``/``call_soon_threadsafe`` but nothing
that batches wake-ups of a fast producer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from kit.engine.types import Event, ReasoningDelta, TextDelta

#: A request's last item (after its last event, or after the error it failed with).
END: Any = object()


class LoopSink:
    """Events from another thread to an asyncio consumer, in batches: a wake-up of the
    event loop is scheduled only when none is pending, so when the HTTP side lags behind
    decode, the events that piled up arrive together (and are merged into fewer deltas,
    see :func:`merge`) instead of costing one wake-up, one GIL hand-over and one SSE
    chunk each. Calling the sink after the loop closed sets ``cancelled`` (nobody listens).

    Args:
        loop: the consumer's running event loop.
        cancelled: set when the loop is closed (the producer then stops).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cancelled: threading.Event) -> None:
        self.loop, self.cancelled = loop, cancelled
        self.events: asyncio.Queue[list[Any]] = asyncio.Queue()
        self._pending: list[Any] = []
        self._scheduled = False
        self._lock = threading.Lock()

    def __call__(self, item: Any) -> None:
        """Post one item (an :data:`Event`, an exception, or :data:`END`); any thread."""
        with self._lock:
            self._pending.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the caller's loop is closed
            self.cancelled.set()

    def _deliver(self) -> None:  # on the event loop
        with self._lock:
            items, self._pending = self._pending, []
            self._scheduled = False
        self.events.put_nowait(items)

    async def drain(self) -> AsyncIterator[Event]:
        """Yield the events until :data:`END`; an exception item is raised."""
        while True:
            for item in merge(await self.events.get()):
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item


def settle_from_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future
                       ) -> Callable[[Any, BaseException | None], None]:
    """A ``reply(result, error)`` callable that settles ``future`` on ``loop`` from any
    thread (a no-op once the loop is closed or the future is done)."""
    def reply(result: Any, error: BaseException | None) -> None:
        def settle() -> None:
            if not future.done():
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass
    return reply


def merge(items: list[Any]) -> list[Any]:
    """``items`` with consecutive text (or reasoning) deltas joined into one, their
    logprobs concatenated; every other item kept as is, in order."""
    out: list[Any] = []
    for item in items:
        last = out[-1] if out else None
        if type(item) is TextDelta and type(last) is TextDelta:
            out[-1] = TextDelta(last.text + item.text, last.logprobs + item.logprobs)
        elif type(item) is ReasoningDelta and type(last) is ReasoningDelta:
            out[-1] = ReasoningDelta(last.text + item.text)
        else:
            out.append(item)
    return out
