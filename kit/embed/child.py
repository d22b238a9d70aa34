"""The embedding process: started by :class:`kit.embed.process.EmbedProcess` as ``python -c``
with the fd of its end of a socketpair; its first frame is an :class:`EmbedInit`. It loads
the model, reports an :class:`EmbedState`, then answers calls one at a time in arrival
order on its main thread until an :class:`EmbedStop` or the pipe's end.

Apart from the engine process so an embedding call never waits behind a long generation
(nor a generation behind a batch of 2,048 inputs), and a crash of either leaves the other
serving.
"""

from __future__ import annotations

import base64
import logging
import os
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from kit.blas import preload_blas
from kit.embed import wire
from kit.embed.model import Embedder
from kit.embed.wire import EmbedCall, EmbedFailed, EmbedInit, EmbedState, EmbedStop, EmbedVectors
from kit.engine.proc.child import ignore_stop_signals
from kit.engine.proc.wire_records import WireError, error_record
from kit.errors import KitError, ModelLoadError
from kit.logfile import setup_engine

log = logging.getLogger("mlx_kit.embed")

#: what :mod:`kit.embed.process` runs
CHILD_CODE = "from kit.embed.child import main; main()"


def _send(conn: Connection, record: wire._Rec, ident: int = 0) -> None:
    conn.send_bytes(wire.encode(record, ident))


def main(argv: list[str] | None = None) -> None:
    """The embedding process's entry point (``argv[1]``: its pipe's fd). Exits 0 when the
    server goes away or says stop, 1 when its first frame is not an :class:`EmbedInit`."""
    ignore_stop_signals()
    argv = sys.argv if argv is None else argv
    conn = Connection(int(argv[1]))
    try:
        init, _ = wire.recv(conn, wire.TO_CHILD_MAX)
    except (EOFError, OSError):
        sys.exit(0)
    except WireError as e:
        sys.stderr.write(f"mlx-kit embeddings: the server's first frame was refused: {e}\n")
        sys.exit(1)
    if not isinstance(init, EmbedInit):
        sys.stderr.write("mlx-kit embeddings: the server's first frame was not an init\n")
        sys.exit(1)
    setup_engine(init.log_level)
    os.environ["HF_HUB_OFFLINE"] = "1"  # a folder was named: nothing is fetched
    preload_blas()  # before mlx is imported (kit.embed.model imports it only at load)
    try:
        t0 = time.perf_counter()
        embedder = Embedder.load(Path(init.path), init.context_window)
        _send(conn, EmbedState(state="ready", dims=embedder.dims, window=embedder.window,
                               weights_bytes=embedder.weights_bytes,
                               load_seconds=round(time.perf_counter() - t0, 3),
                               pooling=embedder.pooling))
    except Exception as e:  # reported, then the process waits for its stop
        log.error("embedding model load failed: %s", e)
        _send(conn, EmbedState(state="failed", error=str(e)[:60_000]))
        embedder = None
    _serve(conn, embedder)


def _serve(conn: Connection, embedder: Embedder | None) -> None:
    while True:
        try:
            record, ident = wire.recv(conn, wire.TO_CHILD_MAX)
        except (EOFError, OSError):
            return
        except WireError as e:
            if e.ident is None:  # out of step: nothing more can be trusted
                log.error("embedding pipe: %s", e)
                return
            _send(conn, EmbedFailed(error=error_record(e)), e.ident)
            continue
        if isinstance(record, EmbedStop):
            return
        if not isinstance(record, EmbedCall):
            continue
        try:
            _send(conn, _answer(embedder, record), ident)
        except (EOFError, OSError):
            return
        except Exception as e:  # a bad input (InvalidRequest) or the model's failure
            if not isinstance(e, KitError):
                log.exception("embedding call failed")
            _send(conn, EmbedFailed(error=error_record(e)), ident)


def _answer(embedder: Embedder | None, call: EmbedCall) -> EmbedVectors:
    if embedder is None:
        raise ModelLoadError("the embedding model failed to load")
    ids = (embedder.tokenize(call.texts, call.truncate) if call.texts is not None
           else embedder.check_ids(call.ids or [], call.truncate))
    vectors = embedder.embed(ids)
    return EmbedVectors(vectors=base64.b64encode(vectors.astype("<f4").tobytes()).decode(),
                        count=len(ids), dims=embedder.dims, tokens=[len(x) for x in ids])
