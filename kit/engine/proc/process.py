"""The engine in its own process: generation never shares a GIL with HTTP.

The server (parent) runs HTTP; a child process (``python -c``, started by
:mod:`kit.engine.proc.launch`) owns the model and runs :class:`kit.engine.decode.engine.Engine`'s worker loop on its main thread (that side:
:mod:`kit.engine.proc.child`). Measured on an H200 (docs/performance.md): decode in a worker
thread beside the server's event loop loses 5-17% to GIL hand-overs and thread
scheduling; in a child process it keeps the speed of ``mlx_lm.stream_generate`` on a
main thread. vLLM splits its engine core from its API server for the same reason.

Wire protocol (one socketpair, framed by ``multiprocessing.connection.Connection``, of
typed, versioned :mod:`kit.engine.proc.wire` records, sent with ``send_bytes`` and read
under a size bound, never pickles; each end sends under a lock, as a duplex pipe is
written by both). Each side handles tuples:

- process start: ``("init", ModelInfo, EngineConfig, log_level)``, the first message
  (the record a distributed engine's rank 0 gets; the config whole, secrets blanked); the
  child's command line names only its end's fd.
- server -> engine: ``("gen", id, ChatRequest)``, ``("cancel", id)``,
  ``("swap", id, spec)``, ``("count", id, ChatRequest)``, ``("memory", id, None)``,
  ``("stop",)``.
- engine -> server: ``("ev", id, event)`` (events, then ``END``; exceptions are events
  too), ``("reply", id, result, error)`` for swap, count and memory, ``("state", snapshot)``
  after every change of :meth:`Engine.snapshot` (sent before the ``Finished`` event that
  follows it, so ``/health`` never lags behind an answer the client has).
- An exception crosses as a record and is rebuilt as its class if it is one of
  :data:`kit.engine.proc.wire.ALLOWED`, else as an EngineError naming it. A message that does
  not decode is a :class:`kit.engine.proc.wire.WireError`: the request or call it names fails
  with it; a frame not ours at all ends the link (the engine is killed and restarted).

The pipe is an anonymous socketpair (the child's end passed as an fd, ``pass_fds``):
no path or port names it. Nothing on it is deserialized into code all the same: a
distributed engine's rank 0 speaks this protocol over a Unix socket
(:mod:`kit.engine.distributed.world_process`), and the rule is the ranks' (:mod:`kit.engine.distributed.world_codec`).

Lifetimes: the server's ``stop`` cancels what still runs (uvicorn has already given its
clients time to finish), then the engine exits. If the server dies (even ``kill -9``), the
engine's pipe reads end-of-file: it cancels what runs and exits. If the engine dies, every
open request fails with :class:`EngineError` and, if that engine had loaded its model, a new
one starts at once on the same model (``state`` is ``restarting`` until it is ready; requests
sent meanwhile wait for it). An engine that dies while loading is not restarted on its own
(the load would likely kill it again): ``state`` is ``failed`` and the next request tries
again; so is one that died :data:`~kit.engine.proc.restarts.RESTART_LIMIT` times in
:data:`~kit.engine.proc.restarts.RESTART_WINDOW_S` seconds. A model that fails to load (the engine alive, reporting it) is ``failed`` too,
until a swap to a model that loads. Ctrl-C, or a SIGTERM to the whole process group
(``timeout``, systemd), reaches both processes; the engine ignores SIGINT and SIGTERM
(blocked from before its start until it does) and stops through the pipe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import signal
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from kit.engine.decode.bridge import END, LoopSink
from kit.engine.proc import wire
from kit.engine.proc.child import STOPPED_BY_THE_SERVER, WIRE_END
from kit.engine.proc.launch import Link as _Link  # world_process and tests import it here
from kit.engine.proc.launch import start_child
from kit.engine.proc.restarts import COUNTERS as _COUNTERS
from kit.engine.proc.restarts import RESTART_LIMIT as _RESTART_LIMIT  # noqa: F401 (tests)
from kit.engine.proc.restarts import RestartWindow, add_counters
from kit.engine.interface import SwapResult
from kit.engine.types import ChatRequest, EngineError, EngineUnavailable, Event
from kit.models.resolve import ModelInfo, check_spec
from kit.engine.status import status_of
from kit.engine.cache.kv import describe
from kit.config import EngineConfig

if TYPE_CHECKING:
    from kit.engine.status import EngineStatus

log = logging.getLogger("mlx_kit.engine")

_CALL_TIMEOUT_S = 30.0  # count_tokens: the engine answers from its pipe thread at once


def _died(code: int | None) -> EngineUnavailable:
    """What waiters on an engine that exited with ``code`` unasked are told."""
    return EngineUnavailable(f"the engine process exited unexpectedly (exit code {code}); "
                             "a new one is starting")


class EngineProcess:
    """:class:`kit.engine.interface.EngineLike`, as :class:`Engine` is, with the engine in
    a child process. If that process dies (a crash, the OOM killer), open requests fail
    and a new one starts on the same model: ``state`` is
    ``restarting`` (the reason in ``error``) until it is ready; ``restarts`` counts them.
    If it died while loading, or too often (:data:`~kit.engine.proc.restarts.RESTART_LIMIT`), ``state`` is
    ``failed`` instead and the next request starts a new one.

    Args:
        model: what to load first.
        config: the knobs (:class:`kit.config.EngineConfig`, without secrets:
            :meth:`~kit.config.EngineConfig.for_engine`), handed whole to every engine
            process it starts (restarts too); default: defaults and the environment.
    """

    def __init__(self, model: ModelInfo, config: EngineConfig | None = None) -> None:
        config = config if config is not None else EngineConfig()
        self.model_info = model
        self.state = "loading"
        self.error: str | None = None
        self.error_type: str | None = None  # the engine's (kit.engine.decode.engine.Engine)
        self.requests_served = self.swaps = self.reloads = self.unloads = self.restarts = 0
        self.load_seconds: float | None = None
        self.phase: str | None = "loading weights"  # the engine's own reports replace it
        self.ttl = config.ttl or None
        self.max_batch = config.batch
        #: /health's KV settings until the engine's first snapshot (which adds its layers)
        self.kv_cache: dict[str, Any] = {
            **describe(config.kv_bits, config.kv_group_size),
            "quantized_layers": None, "layers": None, "max_batch": self.max_batch}
        self.config = config
        #: the engine's last reports (None until its first snapshot; ``distributed``: a
        #: distributed engine's ranks)
        self.prompt_cache: dict[str, int] | None = None
        self.admission: dict[str, Any] | None = None
        self.distributed: dict[str, Any] | None = None
        self.draft: dict[str, Any] | None = None  # speculative decoding's (--draft-model)
        self._memory: dict[str, int | None] = {
            "active_bytes": None, "peak_bytes": None, "weights_bytes": None}
        self._capabilities: dict[str, Any] = {"tools": False, "reasoning": False,
                                              "tool_format": None, "reasoning_format": None,
                                              "vision": False, "audio": False}
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self._start_lock = threading.Lock()
        self._stopping = False
        self._exit_hook = False  # atexit.register(self.stop) done (once: restarts reuse it)
        self._link: _Link | None = None
        self._base: dict[str, int] = {}  # counters of engines that ended
        self._restarts = RestartWindow()  # the automatic ones (restarts.py)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine process (it loads the model) and the thread reading from it.

        Raises:
            WireError: the config does not fit the ``init`` record.
            OSError: the engine process cannot be started.
        """
        import atexit

        # Ctrl-C or a group SIGTERM must not reach the engine before serve_engine ignores
        # them (a traceback from its imports, or a death taken for a crash, otherwise):
        # the child inherits this thread's blocked signals
        # (and a stop that arrives meanwhile must find the link to stop it through)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPED_BY_THE_SERVER)
        try:
            conn, process = start_child(self.model_info, self.config)
            self._link = link = _Link(conn, process)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if not self._exit_hook:
            # a server leaving by any path stops its engine through the pipe (its pipe's
            # end-of-file would end it too, but only once this process is gone)
            atexit.register(self.stop)
            self._exit_hook = True
        threading.Thread(target=self._read, args=(link,), name="mlx-kit-engine-reader",
                         daemon=True).start()

    @property
    def pid(self) -> int | None:
        """The engine process's pid (None before ``start``)."""
        return self._link.process.pid if self._link is not None else None

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the first load finished (or failed). Returns True when ready."""
        self._ready.wait(timeout)
        return self.state == "ready"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine: what still runs is cancelled (the server has already let its
        clients finish), then it exits; after ``timeout`` seconds it is killed. Safe to
        call twice."""
        with self._start_lock:  # so no restart (in _gone) starts an engine we miss here
            link = self._link
            if link is None or self._stopping:
                return
            self._stopping = True
        link.send(("stop",))
        if not link.closed.wait(timeout):  # the reader thread reaps it (one joiner only)
            log.warning("the engine process did not stop in %.0f s; killing it", timeout)
            link.process.kill()  # it ignores SIGTERM (STOPPED_BY_THE_SERVER)
            link.closed.wait(5)

    def memory(self) -> dict[str, int | None]:
        """mlx's allocator in the engine process as it last reported it (at its last state
        change or :meth:`current_memory` call): bytes in live arrays and at peak, and the
        loaded weights' size."""
        return dict(self._memory)

    async def current_memory(self, timeout: float = 0.5) -> dict[str, int | None]:
        """mlx's allocator in the engine process now, asked through the pipe without
        blocking the event loop or a worker thread (``/health`` must answer even when every
        worker thread waits on a stuck engine); after ``timeout`` seconds, :meth:`memory`.
        The engine's pipe thread answers at once, even while it loads; the timeout stays
        well under the 1-2 s that ``status`` and ``launch`` give ``/health``, so a stuck
        engine never makes the server look like something that is not mlx-kit."""
        try:
            if self._link is not None and self._link.process.exitcode is None:
                self._memory = await asyncio.wait_for(
                    asyncio.wrap_future(self._call("memory", None)), timeout)
        except (asyncio.TimeoutError, EngineError):
            pass
        return dict(self._memory)

    def capabilities(self) -> dict[str, Any]:
        """See :meth:`Engine.capabilities`."""
        return dict(self._capabilities)

    def status(self) -> EngineStatus:
        """See :meth:`kit.engine.interface.EngineLike.status` (the engine's last report;
        never blocks)."""
        return status_of(self, prompt_cache=self.prompt_cache, admission=self.admission,
                         kv_cache=self.kv_cache, distributed=self.distributed,
                         draft=self.draft)

    # -- API -------------------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        """See :meth:`Engine.generate`; closing the iterator early cancels the request in
        the engine."""
        jid = next(self._ids)
        if not request.request_id:
            request.request_id = f"req-{jid}"
        link = self._alive_link()
        sink = LoopSink(asyncio.get_running_loop(), threading.Event())
        link.sinks[jid] = sink
        finished = False
        try:
            link.send(("gen", jid, request))
            async for event in sink.drain():
                yield event
            finished = True
        finally:
            link.sinks.pop(jid, None)
            if not finished:
                link.send(("cancel", jid))

    def count_tokens(self, request: ChatRequest) -> int:
        """See :meth:`Engine.count_tokens` (blocks until the engine answers; call it from a
        thread)."""
        try:
            return self._call("count", request).result(_CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            raise EngineUnavailable(f"the engine did not answer in {_CALL_TIMEOUT_S:.0f} s") from None

    async def count_tokens_async(self, request: ChatRequest) -> int:
        """:meth:`count_tokens` for the event loop: awaits the engine's reply without
        holding a worker thread (as :meth:`current_memory` does).

        Raises:
            EngineUnavailable: no answer in 30 s; or the engine's own error.
        """
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self._call("count", request)),
                                          _CALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise EngineUnavailable(f"the engine did not answer in {_CALL_TIMEOUT_S:.0f} s") \
                from None

    async def swap(self, spec: str) -> SwapResult:
        """See :meth:`Engine.swap`. A spec no model can have is refused here, as the
        engine would (:func:`kit.models.resolve.check_spec`: InvalidModelSpec, a 400),
        before it meets the pipe's record bounds (a 500 would name the record)."""
        check_spec(spec)
        return await asyncio.wrap_future(self._call("swap", spec))

    # -- pipe ------------------------------------------------------------------------------

    def _alive_link(self) -> _Link:
        """The running engine's link; a new engine process if the last one died.

        Raises:
            EngineError: the server is stopping.
        """
        with self._start_lock:
            if self._stopping:
                raise EngineUnavailable("the server is shutting down")
            link = self._link
            assert link is not None, "start() first"
            code = link.process.exitcode
            if code is None:
                return link
            if not link.death_handled:
                # died, and its reader has not said so yet: the same decision it would take
                # (a restart counted in the window, or failed), not an uncounted restart
                self._after_death(link, code, _died(code))
                if self.state == "failed":
                    raise EngineUnavailable(self.error)
            else:  # failed earlier: this is the next request, which tries again
                self._restart_locked("loading", None)
            return self._link

    def _restart_locked(self, state: str, error: str | None) -> None:
        """Start a new engine process on the current model (hold ``_start_lock``); its
        first state report replaces ``state``/``error``."""
        log.info("starting a new engine process for %s", self.model_info.id)
        self.restarts += 1
        self._base = {k: getattr(self, k) for k in _COUNTERS}  # the new one counts from 0
        self.state, self.error, self._ready = state, error, threading.Event()
        self.phase = "loading weights"
        self.error_type = None
        self.start()

    def _call(self, kind: str, arg: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            link = self._alive_link()
        except EngineError as e:
            future.set_exception(e)
            return future
        cid = next(self._ids)
        link.calls[cid] = future
        try:
            link.send((kind, cid, arg))
        except wire.WireError as e:  # a request past the pipe's bound: this call fails
            link.calls.pop(cid, None)
            future.set_exception(e)
        return future

    def _read(self, link: _Link) -> None:
        """On a thread: route what one engine process sends until its pipe closes."""
        while True:
            try:
                message = wire.recv(link.conn, wire.TO_SERVER_MAX)
            except wire.WireError as e:  # never unpickled, never run: refused, named
                log.error("refused a message from the engine process: %s", e)
                if wire.fail_refused(e, link.sinks, link.calls):
                    continue
                link.process.kill()  # out of step with us: nothing more it sends can be read
                break
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "ev":
                sink = link.sinks.get(message[1])
                if sink is not None:
                    sink(END if message[2] == WIRE_END else message[2])
            elif kind == "state":
                snap = message[1]
                add_counters(snap, self._base)
                self._memory = snap.pop("memory")
                self._capabilities = snap.pop("capabilities")
                loading = snap["state"] == "loading"
                if loading and self.state == "restarting":
                    # a new engine's load progress (its phase): still a restart, and why
                    snap["state"], snap["error"] = self.state, self.error
                self.__dict__.update(snap)
                if not loading:
                    self._ready.set()
            elif kind == "reply":
                future = link.calls.pop(message[1], None)
                if future is not None and future.set_running_or_notify_cancel():
                    if message[3] is not None:  # (a waiter that gave up cancelled it)
                        future.set_exception(message[3])
                    else:
                        future.set_result(message[2])
        self._gone(link)

    def _gone(self, link: _Link) -> None:
        """An engine's pipe closed: fail what waited on it, say why, and start a new engine
        if the dead one had loaded its model (see the class docstring)."""
        link.process.join(5)
        link.conn.close()
        code = link.process.exitcode
        error = EngineUnavailable("the server is shutting down") if self._stopping \
            else _died(code)
        with self._start_lock:
            if self._link is link:
                self.phase = None  # no engine runs a load now (a restart sets it again)
            if self._link is link and self._stopping:
                self.state, self.error = "stopped", None
            elif self._link is link:  # not yet replaced by a new engine process
                if not link.death_handled:
                    self._after_death(link, code, error)
                if self.state == "failed":  # not restarted: tell open requests why
                    error = EngineUnavailable(self.error)
        for sink in list(link.sinks.values()):
            sink(error)
            sink(END)
        for future in list(link.calls.values()):
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        link.calls.clear()
        if self._link is link:
            self._ready.set()
        link.closed.set()

    def _after_death(self, link: _Link, code: int | None, error: EngineError) -> None:
        """The current engine (``link``'s) died unexpectedly (called holding
        ``_start_lock``, once per link): restart it, or say ``failed`` and why when a
        restart would not help."""
        link.death_handled = True
        refusal = self._restarts.refusal(self.state, code, self.model_info.id)
        if refusal is None:
            log.error("%s", error)
            self._restart_locked("restarting", str(error))
            return
        self.state, self.error = "failed", refusal
        log.error("%s", self.error)
