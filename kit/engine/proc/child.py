"""The engine process's side of :mod:`kit.engine.proc.process`: its entry point
(:func:`main`, run by :mod:`kit.engine.proc.launch`), :func:`serve_engine`, and the server of the pipe that drives an :class:`Engine` (the wire
protocol is described there; every message is a :mod:`kit.engine.proc.wire` frame, never a
pickle). Kept apart so each module has one side of the pipe."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from kit.blas import preload_blas
from kit.engine.cache import reclaim
from kit.engine.proc import wire
from kit.engine.decode.bridge import END
from kit.engine.decode.engine import Engine
from kit.engine.decode.run import Job, Swap
from kit.engine.types import EngineError
from kit.logfile import setup_engine
from kit.models.resolve import ModelInfo

if TYPE_CHECKING:
    from kit.config import EngineConfig

log = logging.getLogger("mlx_kit.engine")

WIRE_END = wire.WIRE_END  # END in a message (an object() cannot cross)


class _PipeServer:
    """The engine in the child: its worker loop runs on the main thread; a reader thread
    turns pipe messages into queued work; events and state go back through the pipe."""

    def __init__(self, conn: Any, model: ModelInfo, config: EngineConfig,
                 extra_state: Callable[[], dict[str, Any]] | None = None,
                 **hooks: Any) -> None:
        """``config``: the engine's knobs (:class:`kit.config.EngineConfig`);
        ``extra_state``: called at every state change (on the worker), its keys added to
        the snapshot sent (a distributed engine's ``distributed``); ``hooks``:
        :class:`Engine`'s other keyword arguments (a rank's inbox, loader, ...)."""
        self._conn = conn
        self._send_lock = threading.Lock()
        self._live: dict[int, Job] = {}
        self._extra = extra_state
        self.engine = Engine(model, config, on_change=self._changed, **hooks)

    def send(self, message: tuple) -> None:
        """Send one message (a tuple of :mod:`kit.engine.proc.process`'s protocol) as a
        :mod:`kit.engine.proc.wire` frame; one that cannot be encoded (past its bound, not
        its record) is logged and its request or call gets the error instead."""
        try:
            frame = wire.encode(message)  # outside the lock: the other senders go on
        except Exception as e:
            log.exception("cannot send %s to the server", message[0])
            error = EngineError(f"{type(e).__name__}: {e}")
            if message[0] == "ev":
                frame = wire.encode(("ev", message[1], error))
            elif message[0] == "reply":
                frame = wire.encode(("reply", message[1], None, error))
            else:
                return
        with self._send_lock:
            try:
                self._conn.send_bytes(frame)
            except (OSError, ValueError):  # the server is gone; read_commands ends us
                pass

    def _changed(self) -> None:
        # the collective part first: a local failure below must not skip it on rank 0 only
        extra = self._extra() if self._extra is not None else {}
        snapshot = self.engine.snapshot()
        snapshot.update(extra)
        self.send(("state", snapshot))

    def _event_sink(self, jid: int) -> Any:
        def post(item: Any) -> None:
            if item is END:
                self._live.pop(jid, None)
                item = WIRE_END
            self.send(("ev", jid, item))
        return post

    def read_commands(self) -> None:
        """On a thread: queue what the server asks for until it says stop or goes away."""
        while True:
            message = job = None  # the last request (maybe megabytes) must not outlive it
            engine = self.engine
            if engine.reclaim_heap:  # a large count_tokens: beside the worker, heap only
                engine.reclaim_heap = False
                reclaim.give_back(mlx_cache=False)
            try:
                message = wire.recv(self._conn, wire.TO_ENGINE_MAX)
            except wire.WireError as e:  # never unpickled, never run: refused, named
                log.error("refused a message from the server: %s", e)
                if e.stream == "ev":  # that request alone fails
                    self.send(("ev", e.ident, e))
                    self.send(("ev", e.ident, WIRE_END))
                    continue
                if e.stream == "reply":
                    self.send(("reply", e.ident, None, e))
                    continue
                message = None  # not ours at all: as if the server were gone
            except (EOFError, OSError):  # the server died
                message = None
            if message is None:  # stop what runs, then exit
                for job in list(self._live.values()):
                    engine.cancel(job)
                engine.submit(None)
                return
            kind = message[0]
            if kind == "gen":
                job = Job(message[2], self._event_sink(message[1]), jid=message[1])
                self._live[message[1]] = job
                engine.submit(job)
            elif kind == "cancel":
                job = self._live.get(message[1])
                if job is not None:
                    engine.cancel(job)
            elif kind == "swap":
                cid = message[1]
                engine.submit(Swap(message[2], lambda r, e, cid=cid: self.send(
                    ("reply", cid, r, e))))
            elif kind == "memory":  # allocator counters: no need to queue
                self.send(("reply", message[1], engine.memory(), None))
            elif kind == "count":  # the tokenizer is only read: no need to queue
                try:
                    self.send(("reply", message[1], engine.count_tokens(message[2]), None))
                except Exception as e:
                    self.send(("reply", message[1], None, e))
            elif kind == "stop":  # the server let its clients finish: the rest is abandoned
                for job in list(self._live.values()):
                    engine.cancel(job)
                engine.submit(None)
                return


#: the signals the engine process ignores (blocked from before its start until it does):
#: the server stops it through the pipe, or the pipe's end-of-file when the server is gone
STOPPED_BY_THE_SERVER = frozenset({signal.SIGINT, signal.SIGTERM})


def ignore_stop_signals() -> None:
    # Ctrl-C, and a SIGTERM to the whole process group (`timeout`, systemd, a terminal's
    # job control), reach us with the server: the server stops us through the pipe once
    # its clients are done; dying first would look like a crash and start a new engine.
    for sig in STOPPED_BY_THE_SERVER:
        signal.signal(sig, signal.SIG_IGN)  # a signal pending since start() is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPED_BY_THE_SERVER)  # blocked by start()


def main(argv: list[str] | None = None) -> None:
    """The engine process's entry point: ``argv[1]`` (default ``sys.argv``) is the fd of
    its end of the pipe; the first message on it is ``("init", ModelInfo, EngineConfig,
    log_level)`` (a :mod:`kit.engine.proc.wire` record, never a pickle); then
    :func:`serve_engine`. Exits 0 if the server went away before the ``init``, 1 if the
    first message is refused or not an ``init``."""
    ignore_stop_signals()
    argv = sys.argv if argv is None else argv
    conn = Connection(int(argv[1]))
    try:
        kind, *init = wire.recv(conn, wire.TO_ENGINE_MAX)
    except (EOFError, OSError):  # the server died before it said what to load
        sys.exit(0)
    except wire.WireError as e:  # no log file yet: stderr, the server's
        sys.stderr.write(f"mlx-kit engine: the server's first message was refused: {e}\n")
        sys.exit(1)
    if kind != "init":
        sys.stderr.write(f"mlx-kit engine: the server's first message was {kind!r}, "
                         "not init\n")
        sys.exit(1)
    model, config, level = init
    serve_engine(conn, model, config, level)


def serve_engine(conn: Any, model: ModelInfo, config: EngineConfig, log_level: int) -> None:
    """Load ``model`` with ``config`` (its knobs, whole) and serve ``conn`` (a
    ``multiprocessing.connection.Connection`` of :mod:`kit.engine.proc.wire` frames) on
    this, the main, thread until told to stop or the server goes away. Ignores SIGINT and
    SIGTERM (:data:`STOPPED_BY_THE_SERVER`) from its start."""
    ignore_stop_signals()

    setup_engine(log_level)  # the server's log file (rotated by the server) or stderr

    preload_blas()  # before mlx is imported
    server = _PipeServer(conn, model, config)
    threading.Thread(target=server.read_commands, name="mlx-kit-engine-pipe",
                     daemon=True).start()
    server.engine.run_worker()
