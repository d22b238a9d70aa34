"""The server's handle on its embedding process (:mod:`kit.embed.child`): start it, send it
calls, read its answers, restart it after a crash. Pure Python, no mlx: the HTTP process
imports it.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import itertools
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any

from kit.embed import wire
from kit.embed.child import CHILD_CODE
from kit.embed.wire import EmbedCall, EmbedFailed, EmbedInit, EmbedState, EmbedStop, EmbedVectors
from kit.engine.proc.child import STOPPED_BY_THE_SERVER
from kit.engine.proc.launch import Child, spawn
from kit.engine.proc.wire_records import WireError, rebuild_error
from kit.errors import EngineUnavailable, ModelLoadError
from kit.models.resolve import ModelInfo

log = logging.getLogger("mlx_kit.embed")

#: the id the server lists the embedding model under, whatever model it is
EMBED_MODEL_ID = "local-embed"


@dataclass(frozen=True)
class Vectors:
    """One call's answer: ``data``, ``count`` × ``dims`` little-endian float32 (each row
    L2-normalised), and the tokens each input took."""

    data: bytes
    count: int
    dims: int
    tokens: list[int]


class EmbedProcess:
    """The embedding model in its own process, behind :data:`EMBED_MODEL_ID`.

    Attributes:
        model_info: the model (its id, folder and context window).
        state: ``loading``, ``ready``, ``failed`` (``error`` says why) or ``stopped``.
        dims, window, weights_bytes, load_seconds, pooling: from its load (None before;
            window: most tokens per input).
        restarts: processes replaced after a crash.
        requests_served, inputs_served: calls answered, and the inputs they held.
    """

    def __init__(self, model: ModelInfo) -> None:
        self.model_info = model
        self.state = "loading"
        self.error: str | None = None
        self.dims: int | None = None
        self.weights_bytes: int | None = None
        self.load_seconds: float | None = None
        self.pooling: str | None = None
        self.window: int | None = None
        self.restarts = 0
        self.requests_served = 0
        self.inputs_served = 0
        self._ids = itertools.count(1)
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()  # the link, the calls
        self._send_lock = threading.Lock()
        self._conn: Any = None
        self._child: Child | None = None
        self._ready = threading.Event()
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def status(self) -> dict[str, Any]:
        """``/health``'s ``embeddings`` (:class:`kit.health.EmbedStatus`'s fields)."""
        return {"id": EMBED_MODEL_ID, "model": self.model_info.id, "state": self.state,
                "error": self.error, "pid": self.pid, "dims": self.dims,
                "window": self.window, "pooling": self.pooling,
                "weights_bytes": self.weights_bytes, "load_seconds": self.load_seconds,
                "requests_served": self.requests_served,
                "inputs_served": self.inputs_served, "restarts": self.restarts}

    def api_entry(self) -> dict[str, Any]:
        """Its ``/v1/models`` entry: ``local-embed``, ``type`` ``embedding`` (LM Studio's
        word), ``capabilities.embeddings`` true and no chat capability, so agents that
        list the server's models can leave it out of their chat models."""
        return {"id": EMBED_MODEL_ID, "name": f"{self.model_info.id} (mlx-kit embeddings)",
                "model": self.model_info.id, "type": "embedding",
                "context_window": self.window or self.model_info.context_window,
                "dimensions": self.dims,
                "capabilities": {"embeddings": True, "tools": False, "reasoning": False,
                                 "vision": False},
                "loaded": self.state == "ready"}

    def start(self) -> None:
        """Start the process (it loads the model in the background).

        Raises:
            OSError: the interpreter cannot be started.
        """
        m = self.model_info
        init = wire.encode(EmbedInit(model_id=m.id, path=str(m.path),
                                     context_window=m.context_window,
                                     log_level=logging.getLogger("mlx_kit").getEffectiveLevel()))
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPED_BY_THE_SERVER)
        try:
            conn, child = spawn(CHILD_CODE, init)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        with self._lock:
            self._conn, self._child = conn, child
        threading.Thread(target=self._read, args=(conn, child), name="mlx-kit-embed-reader",
                         daemon=True).start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the load ended (at most ``timeout`` s); whether it is ``ready``."""
        self._ready.wait(timeout)
        return self.state == "ready"

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the process to exit, then kill it after ``timeout`` seconds. Idempotent."""
        with self._lock:
            self._stopping = True
            conn, child = self._conn, self._child
        if child is None:
            return
        try:
            with self._send_lock:
                conn.send_bytes(wire.encode(EmbedStop()))
        except (OSError, ValueError):
            pass
        child.join(timeout)
        child.kill()  # no-op once it exited and was reaped (its pid may be anyone's then)
        self.state = "stopped"

    async def embed(self, *, texts: list[str] | None = None,
                    ids: list[list[int]] | None = None, truncate: bool = True) -> Vectors:
        """Embed ``texts`` or ``ids`` (one token list per input).

        Raises:
            InvalidRequest: an input the model refuses (``field`` ``input.N``).
            ModelLoadError: the model failed to load.
            EngineUnavailable: the model is loading, or the process died with this call.
            WireError: the call is past the pipe's bound.
        """
        if self.state == "loading":
            raise EngineUnavailable("the embedding model is loading")
        if self.state == "failed" and self._child is not None \
                and self._child.exitcode is None:
            raise ModelLoadError(f"the embedding model failed to load: {self.error}")
        self._restart_if_dead()
        call = EmbedCall(texts=texts, ids=ids, truncate=truncate)
        ident = next(self._ids)
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._calls[ident] = future
            conn = self._conn
        try:
            # encoding and sending a large call is the caller's cost, off the event loop
            await asyncio.to_thread(self._send, conn, call, ident)
            record = await asyncio.wrap_future(future)
        finally:
            with self._lock:
                self._calls.pop(ident, None)
        self.requests_served += 1
        self.inputs_served += record.count
        return Vectors(base64.b64decode(record.vectors), record.count,
                       record.dims, list(record.tokens))

    def _send(self, conn: Any, call: EmbedCall, ident: int) -> None:
        frame = wire.encode(call, ident)
        with self._send_lock:
            try:
                conn.send_bytes(frame)
            except (OSError, ValueError):  # gone: the reader fails the call
                pass

    def _restart_if_dead(self) -> None:
        with self._lock:
            child = self._child
            if self._stopping or child is None or child.exitcode is None:
                return
            self.restarts += 1
            self.state = "loading"
            self._ready.clear()
        log.warning("the embedding process exited (code %s); starting a new one",
                    child.exitcode)
        self.start()
        raise EngineUnavailable("the embedding process is restarting; try again shortly")

    def _read(self, conn: Any, child: Child) -> None:
        while True:
            try:
                record, ident = wire.recv(conn, wire.TO_SERVER_MAX)
            except (EOFError, OSError):
                break
            except WireError as e:
                if e.ident is None:
                    log.error("embedding pipe: %s", e)
                    break
                self._settle(e.ident, error=e)
                continue
            if isinstance(record, EmbedState):
                self.dims, self.weights_bytes = record.dims, record.weights_bytes
                self.window = record.window
                self.load_seconds, self.pooling = record.load_seconds, record.pooling
                self.state, self.error = record.state, record.error
                self._ready.set()
            elif isinstance(record, EmbedVectors):
                self._settle(ident, result=record)
            elif isinstance(record, EmbedFailed):
                self._settle(ident, error=rebuild_error(record.error))
        child.join(1.0)
        code = child.exitcode
        with self._lock:
            calls = list(self._calls.values())
            self._calls.clear()
            if not self._stopping:
                self.state = "failed"
                self.error = f"the embedding process exited (code {code})"
        self._ready.set()
        for future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineUnavailable(
                    f"the embedding process exited (code {code}) with this call in hand"))
        conn.close()

    def _settle(self, ident: int, *, result: Any = None, error: BaseException | None = None
                ) -> None:
        with self._lock:
            future = self._calls.pop(ident, None)
        if future is None or not future.set_running_or_notify_cancel():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
