"""How :class:`kit.engine.proc.process.EngineProcess` starts its engine process, and the
:class:`Link` it keeps to each one. The start: a plain
``python -c`` child (:func:`kit.engine.proc.child.main`) that inherits one end of a
socketpair, and whose first message on it is an ``init`` record. Nothing is pickled: the
model, the config and the log level cross as the same :class:`kit.engine.proc.wire.Init`
record a distributed engine's rank 0 gets (:mod:`kit.engine.distributed.world_process`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from kit.config import EngineConfig
from kit.engine.decode.bridge import LoopSink
from kit.engine.proc import wire
from kit.models.resolve import ModelInfo
from kit.paths import kernel_cache_dir

#: what the child runs: ``sys.argv[1]`` is the fd of its end of the pipe (a number, never a
#: secret: the config crosses the pipe, and secrets are blanked in it all the same)
_CHILD_CODE = "from kit.engine.proc.child import main; main()"


class Link:
    """One engine process and what waits on it: the pipe, open requests (event sinks) and
    calls (swap, count, memory). A restart makes a new link; the old one fails what it held.
    ``conn``: a ``multiprocessing.connection.Connection``; ``process``: a :class:`Child`,
    or anything with its interface (a distributed engine's ``mlx.launch``)."""

    def __init__(self, conn: Any, process: Any) -> None:
        self.conn, self.process = conn, process
        self.sinks: dict[int, LoopSink] = {}
        self.calls: dict[int, concurrent.futures.Future] = {}
        self.lock = threading.Lock()
        self.closed = threading.Event()  # the reader saw the end and reaped the process
        #: its death was decided on (restart or failed), under the owner's start lock: by
        #: its reader, or by a call that found the process dead first; never twice
        self.death_handled = False

    def send(self, message: tuple) -> None:
        """Send one message as a :mod:`kit.engine.proc.wire` frame.

        Raises:
            WireError: it cannot be encoded (a request past the pipe's bound).
        """
        frame = wire.encode(message)  # outside the lock: the sender's own cost
        with self.lock:
            try:
                self.conn.send_bytes(frame)
            except (OSError, ValueError):  # the engine is gone; the reader reports it
                pass


class Child:
    """The engine process, with the part of ``multiprocessing.Process``'s interface
    :class:`kit.engine.proc.process.EngineProcess` uses: ``pid``, ``exitcode`` (None while
    it runs; ``-N`` when signal N killed it), ``join(timeout)`` (seconds; returns either
    way) and ``kill()`` (SIGKILL: it ignores SIGTERM)."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.popen.poll() is None:  # once reaped, its pid may be anyone's
            self.popen.kill()


def start_child(model: ModelInfo, config: EngineConfig) -> tuple[Connection, Child]:
    """Start an engine process for ``model`` with ``config`` (its secrets blanked on the
    way: :func:`kit.engine.distributed.world_codec.setup_of`) and send it its ``init``.
    Call it with :data:`~kit.engine.proc.child.STOPPED_BY_THE_SERVER` blocked in this
    thread: the child inherits the mask and ignores them before it unblocks them.

    Returns:
        the server's end of the pipe (``send_bytes``/``recv_bytes`` of
        :mod:`kit.engine.proc.wire` frames) and the process.

    Raises:
        WireError: ``config`` does not fit the ``init`` record (checked before any start).
        OSError: the interpreter cannot be started.
    """
    # encoded first: a config the record refuses fails here, with no process to reap
    init = wire.encode(("init", model, config,
                        logging.getLogger("mlx_kit").getEffectiveLevel()))
    return spawn(_CHILD_CODE, init)


def spawn(code: str, init: bytes, env: dict[str, str] | None = None
          ) -> tuple[Connection, Child]:
    """Start ``python -c code FD`` with FD its end of a new socketpair, and send ``init``
    (its first frame) on it. The engine process and the embedding process
    (:mod:`kit.embed.process`) start this way. Call it with the stop signals blocked (see
    :func:`start_child`). ``env``: variables added to the child's environment.

    Returns:
        the parent's end of the pipe and the process.

    Raises:
        OSError: the interpreter cannot be started.
    """
    # read by mlx's CUDA build; the child inherits os.environ
    os.environ.setdefault("MLX_PTX_CACHE_DIR", str(kernel_cache_dir()))
    # A socketpair wrapped in multiprocessing's Connection, not a new framing of our own:
    # Connection only frames bytes (send_bytes/recv_bytes, a length header; it pickles
    # nothing unless send()/recv() are called, which no side does), its size bound is the
    # one wire.recv relies on, and rank 0 speaks the same framing over its Unix socket.
    # Anonymous, as ctx.Pipe() was: no path or port names it.
    ours, theirs = socket.socketpair()
    conn = Connection(ours.detach())
    try:
        # fork + exec at once (never a bare fork, which would copy the server's threads);
        # the signal mask the caller set is inherited through both (restore_signals resets
        # dispositions, never the mask); stdin /dev/null, as multiprocessing gave its children
        popen = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())],
                                 pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                 env={**os.environ, **env} if env else None)
    except BaseException:
        conn.close()
        raise
    finally:
        theirs.close()  # the child's end lives in the child only: its death is our EOF
    try:
        conn.send_bytes(init)
    except OSError:  # it died already: the reader sees EOF and reports the exit code
        pass
    return conn, Child(popen)
