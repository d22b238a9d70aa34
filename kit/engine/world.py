"""The ranks of a distributed engine as one group: ``mx.distributed`` plus what mlx-kit
shares over it (Python objects from one rank to all, each rank's facts to rank 0), and
the watchdog that ends a rank whose peers stopped answering.

Objects travel as mlx_lm.server shares requests (``_share_object`` in mlx_lm/server.py):
pickled into a uint8 array that only the sending rank fills, ``all_sum``-ed with the
others' zeros, after an ``all_sum`` of its length. mx.distributed has no broadcast of
bytes, so this is our own few lines over its collectives, not a transport of our own.
Imported only in rank processes (it imports mlx).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import threading
import time
from typing import Any

import mlx.core as mx

from kit.engine.hosts import EXIT_PEER_LOST  # the ranks import it from here

log = logging.getLogger("mlx_kit.engine")

_MAX_SHARE_BYTES = 1 << 32  # far above a request's body limit


class WorldLost(BaseException):
    """A collective failed (a peer exited or cannot be reached). A BaseException: the
    engine's ``except Exception`` handlers, which turn a failed request into an error
    event and go on, must not catch it; the rank exits instead."""


class World:
    """This rank's view of the group.

    Args:
        group: ``mx.distributed.init()``'s group.
        timeout: seconds a rank may go without a sync point completing (while not idle
            on rank 0's own queue) before the watchdog ends it.

    Attributes:
        rank, size: this rank's index and the world size.
        host: this machine's host name.
    """

    def __init__(self, group: Any, timeout: float) -> None:
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.host = socket.gethostname()
        self.timeout = timeout
        self.idle = False  # rank 0 waits on its own queue (no collective is pending)
        self.paused = False  # loading: a peer reading a large model from disk is not lost
        self._mark = time.monotonic()

    @classmethod
    def init(cls, backend: str, timeout: float) -> "World":
        """Join the group ``mlx.launch`` started (``backend``: ring, jaccl, mpi, nccl).

        Raises:
            RuntimeError: the backend cannot start (mlx's message).
        """
        return cls(mx.distributed.init(strict=True, backend=backend), timeout)

    # -- sharing ---------------------------------------------------------------------------

    def _all_sum(self, array: Any) -> Any:
        # On mlx-lm's generation stream, where the model's own collectives (tensor
        # parallel all_sums) run: a collective on another stream (mx.cpu) ran beside a
        # decode step still in flight (stream_generate and BatchGenerator async_eval the
        # next step) and the two interleaved on the ring's sockets: followers unpickled
        # garbage and the ranks fell out of step (3 concurrent requests on 3 ranks; a
        # 3-rank all_sum loop measured 38/300 wrong sums on mx.cpu, 0 on the same stream).
        # One stream keeps every rank's collectives in the same order.
        # Within the stream's context and with no stream argument, as the model's own
        # collectives are issued: the backend then picks the same stream for both (ring
        # and JACCL: the default CPU stream, which the context makes generation_stream
        # where it is a CPU stream; NCCL: the GPU one). An explicit GPU stream would fail
        # on Metal, whose all_sum has no GPU kernel.
        from mlx_lm.generate import generation_stream

        try:
            with mx.stream(generation_stream):
                out = mx.distributed.all_sum(array, group=self.group)
            mx.eval(out)
        except RuntimeError as e:
            raise WorldLost(f"rank {self.rank} ({self.host}): {e}") from None
        self._mark = time.monotonic()
        return out

    def share(self, obj: Any = None, root: int = 0) -> Any:
        """``obj`` of rank ``root``, on every rank (the others pass None). Collective:
        every rank calls it at the same point.

        Raises:
            WorldLost: a peer is gone, or what arrived is not what rank ``root`` sent.
        """
        data = pickle.dumps(obj) if self.rank == root and obj is not None else b""
        size = self._all_sum(mx.array([len(data)], dtype=mx.int64)).item()
        if size == 0:  # nothing to share (the idle ticks): one collective, not two
            return None
        if not 0 < size <= _MAX_SHARE_BYTES:  # out of step: do not allocate a garbage size
            raise WorldLost(f"rank {self.rank} ({self.host}): the ranks are out of step "
                            f"(a shared object of {size} bytes)")
        buf = mx.zeros((size,), dtype=mx.uint8)
        if self.rank == root:
            buf = mx.array(memoryview(data), dtype=mx.uint8)
        out = self._all_sum(buf)
        if self.rank == root:
            return obj
        try:
            return pickle.loads(bytes(memoryview(out)))
        except Exception as e:  # not rank 0's bytes: the ranks' collectives are out of step
            raise WorldLost(f"rank {self.rank} ({self.host}): the ranks are out of step "
                            f"(rank {root}'s shared object did not arrive intact: {e})") from None

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (collective)."""
        return [self.share(obj if self.rank == r else None, root=r) for r in range(self.size)]

    def seed(self) -> None:
        """Give every rank's random generator the same state (rank 0 draws it), so that
        sampling makes the same choice on every rank."""
        mx.random.seed(self.share(int.from_bytes(os.urandom(4), "little")
                                  if self.rank == 0 else None))

    def agree(self, error: BaseException | None) -> BaseException | None:
        """The first rank's error of a check every rank ran (None: all passed), with the
        rank and host named when it is not rank 0's own; collective."""
        from kit.errors import KitError, ModelError

        mine = None
        if error is not None:
            mine = error
            try:
                pickle.dumps(error)
            except Exception:  # sharing it must not fail on this rank alone
                mine = ModelError(str(error))
        errors = self.gather(None if mine is None else (mine, self.host))
        for r, e in enumerate(errors):
            if e is None:
                continue
            if r == self.rank and error is not None:
                return error
            other, host = e
            if not isinstance(other, KitError):  # keep the kind (404, 507) and the hint
                return ModelError(f"rank {r} ({host}): {other}")
            other.message = f"rank {r} ({host}): {other.message}"
            other.args = (other.message,)
            return other
        return None

    # -- watchdog --------------------------------------------------------------------------

    def mark(self) -> None:
        """Note progress (a sync point passed)."""
        self._mark = time.monotonic()

    def start_watchdog(self) -> None:
        """End this rank (exit status :data:`EXIT_PEER_LOST`) when no sync point completes
        for ``timeout`` seconds while it is not idle or loading: a peer that hangs
        without closing its connections (a machine that lost power) must not hang the
        others' collectives forever."""
        def watch() -> None:
            while True:
                time.sleep(min(5.0, self.timeout / 4))
                if self.idle or self.paused:
                    self._mark = time.monotonic()
                    continue
                stalled = time.monotonic() - self._mark
                if stalled > self.timeout:
                    log.error("rank %d (%s): no answer from the other ranks for %.0f s "
                              "(--rank-timeout); ending", self.rank, self.host, stalled)
                    logging.shutdown()
                    os._exit(EXIT_PEER_LOST)
        threading.Thread(target=watch, name="mlx-kit-watchdog", daemon=True).start()
