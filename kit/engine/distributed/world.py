"""The ranks of a distributed engine as one group: ``mx.distributed`` plus what mlx-kit
shares over it (records from one rank to all, each rank's facts to rank 0), the proof
that every rank holds the world's secret, and the watchdog that ends a rank whose peers
stopped answering.

Records travel as mlx_lm.server shares requests (``_share_object`` in mlx_lm/server.py),
in a uint8 array that only the sending rank fills, ``all_sum``-ed with the others' zeros,
after an ``all_sum`` of its length; but as authenticated typed frames
(:mod:`kit.engine.distributed.world_codec`), never pickles: anyone who reaches a ring port can put
bytes on the ring (docs/distributed.md, "Who can reach the ring"). mx.distributed has
no broadcast of bytes, so this is our own few lines over its collectives, not a
transport of our own. Imported only in rank processes (it imports mlx).
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
import time
from typing import Any

import mlx.core as mx

from kit import mlx_lm_api
from kit.engine.distributed import world_codec as codec
from kit.engine.distributed.world_codec import Fault, Hello, Proof, Record, Seed
from kit.engine.distributed.world_faults import error_of, fault_of
from kit.engine.distributed.hosts import EXIT_PEER_LOST, EXIT_TAMPERED  # the ranks import them here

log = logging.getLogger("mlx_kit.engine")

class WorldLost(BaseException):
    """A collective failed (a peer exited or cannot be reached). A BaseException: the
    engine's ``except Exception`` handlers, which turn a failed request into an error
    event and go on, must not catch it; the rank exits instead."""


class WorldTampered(WorldLost):
    """What crossed the ring is not what a rank sent: a share failed its MAC, sequence,
    kind or schema check, or a rank could not prove the world's secret, or a ring
    link's far end belongs to another user. The rank exits with
    :data:`kit.engine.distributed.hosts.EXIT_TAMPERED`."""


class World:
    """This rank's view of the group.

    Args:
        group: ``mx.distributed.init()``'s group.
        timeout: seconds a rank may go without a sync point completing (while not idle
            on rank 0's own queue) before the watchdog ends it.
        key: the world's secret (:data:`kit.engine.distributed.world_codec.KEY_BYTES` bytes), which
            every share's MAC is under.

    Attributes:
        rank, size: this rank's index and the world size.
        host: this machine's host name.
    """

    def __init__(self, group: Any, timeout: float, key: bytes) -> None:
        self.group = group
        self.key = key
        self._seq = 0  # shares so far: every rank counts the same ones
        self.rank, self.size = group.rank(), group.size()
        self.host = socket.gethostname()
        self.timeout = timeout
        self.idle = False  # rank 0 waits on its own queue (no collective is pending)
        self.paused = False  # loading: a peer reading a large model from disk is not lost
        self._mark = time.monotonic()

    @classmethod
    def init(cls, backend: str, timeout: float, key: bytes) -> "World":
        """Join the group ``mlx.launch`` started (``backend``: ring, jaccl, mpi, nccl).

        Raises:
            RuntimeError: the backend cannot start (mlx's message).
        """
        return cls(mx.distributed.init(strict=True, backend=backend), timeout, key)

    # -- sharing ---------------------------------------------------------------------------

    def _all_sum(self, array: Any) -> Any:
        # On mlx-lm's generation stream, where the model's own collectives (tensor
        # parallel all_sums) run: a collective on another stream (mx.cpu) ran beside a
        # decode step still in flight (stream_generate and BatchGenerator async_eval the
        # next step) and the two interleaved on the ring's sockets: followers decoded
        # garbage and the ranks fell out of step (3 concurrent requests on 3 ranks; a
        # 3-rank all_sum loop measured 38/300 wrong sums on mx.cpu, 0 on the same stream).
        # One stream keeps every rank's collectives in the same order.
        # Within the stream's context and with no stream argument, as the model's own
        # collectives are issued: the backend then picks the same stream for both (ring
        # and JACCL: the default CPU stream, which the context makes generation_stream
        # where it is a CPU stream; NCCL: the GPU one). An explicit GPU stream would fail
        # on Metal, whose all_sum has no GPU kernel.
        try:
            with mx.stream(mlx_lm_api.generation_stream):
                out = mx.distributed.all_sum(array, group=self.group)
            mx.eval(out)
        except RuntimeError as e:
            raise WorldLost(f"rank {self.rank} ({self.host}): {e}") from None
        self._mark = time.monotonic()
        return out

    def links(self) -> str:
        """This rank's ring links, as an error names them."""
        if self.size == 1:
            return f"rank {self.rank}"
        return (f"the ring links of rank {self.rank} ({self.host}) to rank "
                f"{(self.rank - 1) % self.size} and rank {(self.rank + 1) % self.size}")

    def share(self, kind: type[Record], record: Record | None = None,
              root: int = 0) -> Any:
        """Rank ``root``'s ``record`` (a ``kind``; None: nothing to share), on every rank
        (the others pass None). Collective: every rank calls it at the same point, with
        the same ``kind`` and ``root``. Two all_sums: the frame's length and its MAC
        (:func:`kit.engine.distributed.world_codec.length_tag`; one collective alone when nothing
        is shared), then the frame (:mod:`kit.engine.distributed.world_codec`).

        Raises:
            WorldLost: a peer is gone.
            WorldTampered: what arrived is not what rank ``root`` sent (altered, replayed
                or injected on the ring, or the ranks are out of step).
        """
        seq, self._seq = self._seq, self._seq + 1
        frame = b""
        if self.rank == root and record is not None:
            try:
                frame = codec.encode(self.key, seq, root, record)
            except codec.ShareError as e:  # past its bound: the others would wait forever
                raise WorldLost(f"rank {self.rank} ({self.host}): cannot share: {e}") from None
        prelude = [0, 0]
        if self.rank == root:
            prelude = [len(frame), codec.length_tag(self.key, seq, root, len(frame))]
        size, tag = self._all_sum(mx.array(prelude, dtype=mx.int64)).tolist()
        try:
            codec.check_length(self.key, seq, root, size, tag, kind)
        except codec.ShareError as e:
            raise self._tampered(root, e) from None
        if size == 0:  # nothing to share (the idle ticks): one collective, not two
            return None
        buf = mx.zeros((size,), dtype=mx.uint8)
        if self.rank == root:
            buf = mx.array(memoryview(frame), dtype=mx.uint8)
        out = self._all_sum(buf)
        if self.rank == root:
            return record
        try:
            return codec.decode(self.key, seq, root, kind, bytes(memoryview(out)))
        except codec.ShareError as e:
            raise self._tampered(root, e) from None

    def _tampered(self, root: int, error: Exception) -> "WorldTampered":
        return WorldTampered(f"rank {self.rank} ({self.host}): a share from rank {root} "
                             f"did not arrive as sent ({error}): someone is on "
                             f"{self.links()}, or the ranks are out of step")

    def gather(self, kind: type[Record], record: Record) -> list[Any]:
        """Every rank's ``record`` (a ``kind``), in rank order, on every rank (collective)."""
        return [self.share(kind, record if self.rank == r else None, root=r)
                for r in range(self.size)]

    def prove(self) -> None:
        """Every rank proves to every other that it holds the world's secret, before
        anything else crosses the ring: a fresh challenge from each rank, then each
        rank's MAC over all of them (collective). A stranger that took a rank's place
        without the secret fails its first share; one that replays an old world's
        answers fails the fresh challenges.

        Raises:
            WorldTampered: a rank's answer is not the secret's.
        """
        nonces = [h.nonce for h in self.gather(Hello, Hello(nonce=os.urandom(32).hex()))]
        proofs = self.gather(Proof, Proof(mac=codec.proof_mac(self.key, self.rank, nonces)))
        for r, proof in enumerate(proofs):
            if not hmac.compare_digest(proof.mac, codec.proof_mac(self.key, r, nonces)):
                raise self._tampered(r, codec.ShareError("its proof of the secret failed"))

    def barrier(self) -> None:
        """Wait until every rank got here (an empty share: one authenticated collective)."""
        self.share(Seed, None)

    def seed(self) -> None:
        """Give every rank's random generator the same state (rank 0 draws it), so that
        sampling makes the same choice on every rank."""
        mine = Seed(value=int.from_bytes(os.urandom(4), "little")) if self.rank == 0 else None
        mx.random.seed(self.share(Seed, mine).value)

    def agree(self, error: BaseException | None) -> BaseException | None:
        """The first rank's error of a check every rank ran (None: all passed), with the
        rank and host named when it is not rank 0's own; collective."""
        mine = None if error is None else fault_of(error, self.host)
        faults = self.gather(Fault, mine)
        for r, fault in enumerate(faults):
            if fault is None:
                continue
            if r == self.rank and error is not None:
                return error
            return error_of(fault, r)
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
