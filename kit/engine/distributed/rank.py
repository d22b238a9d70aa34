"""One rank of a distributed engine: ``python -m kit.engine.distributed.rank``, started on every host
by ``mlx.launch`` (see :mod:`kit.engine.distributed.world_process`, the server's side).

Every rank joins the group (:class:`kit.engine.distributed.world.World`), loads its shard with
mlx-lm's ``sharded_load`` and runs the same :class:`kit.engine.decode.engine.Engine` worker loop
over a :class:`kit.engine.distributed.rank_inbox.RankInbox`. Rank 0 also connects to the server
(a ``multiprocessing.connection`` Unix socket whose authkey is in a file only the user can
read, both in the directory ``MLX_KIT_CONTROL`` names) and serves the same pipe protocol
as a single engine process (:mod:`kit.engine.proc.child`): its first message is ``("init",
model, options, log_level)``, which rank 0 shares with the others. Everything on that
socket is a typed :mod:`kit.engine.proc.wire` record (nothing is unpickled); what does not
decode is refused by name.

A rank whose peers are gone (a collective fails, or the watchdog sees none answer for
``MLX_KIT_RANK_TIMEOUT`` seconds) exits with :data:`kit.engine.distributed.hosts.EXIT_PEER_LOST`; a
rank that fails on its own (its shard cannot load) exits 1, so the server can tell which
rank failed first. ``mlx.launch`` then ends the others.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from kit import __version__, mlx_lm_api
from kit.blas import preload_blas, share_cores
from kit.engine.decode.engine import Engine
from kit.engine.decode.prefill import prefill_step_size
from kit.engine.distributed.ring_guard import KeyMissing, check_ring_peers, read_world_key
from kit.engine.distributed.world_codec import Alike, Machine, RankFacts, Setup, setup_of
from kit.engine.proc.child import _PipeServer
from kit.models.resolve import ModelInfo, resolve_model
from kit.knobs import env
from kit.engine.proc import wire

log = logging.getLogger("mlx_kit.engine")


def _logging(rank: int) -> None:
    # the rank in every line: mlx.launch merges every rank's output into one stream
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format=f"%(asctime)s %(levelname)s rank {rank} "
                               f"[{socket.gethostname()}] %(name)s: %(message)s")


def _fatal(message: str, code: int) -> None:
    """Log and leave at once: a rank that cannot follow the others must not run any
    more collectives (a ``finally`` that reports state would pair with the wrong ones)."""
    log.error("%s", message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)


def sharded_loader(world: Any, pipeline: bool) -> Any:
    """A :class:`kit.engine.decode.slot.ModelSlot` loader over the whole group.

    Tensor parallel: mlx-lm's ``load`` (lazily, and strict: every weight the model needs
    must be in the files; mlx-lm's ``sharded_load`` loads with ``strict=False``, which
    served a checkpoint missing four layers with random weights), then the model's own
    ``shard(group)``, as ``sharded_load`` does. Nothing before the shard's evaluation
    runs a collective, so a failure there (missing weights, an unknown architecture) is
    agreed among the ranks and fails the load on every rank: the old model keeps serving.
    Pipeline parallel: ``sharded_load`` (each rank reads only its layers' files).
    A failure once the ranks are inside the load's collectives ends this rank (exit 1)."""
    def load(path: str, trust: bool) -> tuple[Any, Any]:
        import mlx.core as mx

        group = world.group
        if pipeline:
            try:
                return mlx_lm_api.sharded_load(path, pipeline_group=group, tensor_group=None,
                                    tokenizer_config={"trust_remote_code": trust},
                                    trust_remote_code=trust)
            except Exception as e:
                _fatal(f"rank {world.rank} ({world.host}): cannot load its shard of {path}: "
                       f"{type(e).__name__}: {e}", 1)
        error, model, tokenizer = None, None, None
        try:
            model, tokenizer = mlx_lm_api.load(path, tokenizer_config={"trust_remote_code": trust},
                                        lazy=True, trust_remote_code=trust)
            if not hasattr(model, "shard"):
                raise ValueError(f"mlx-lm has no tensor parallel mode for "
                                 f"{type(model).__module__}")
        except Exception as e:
            error = e
        error = world.agree(error)
        if error is not None:
            raise error
        try:
            model.shard(group)
            mx.eval(model.parameters())
        except Exception as e:
            _fatal(f"rank {world.rank} ({world.host}): cannot load its shard of {path}: "
                   f"{type(e).__name__}: {e}", 1)
        world.barrier()  # every rank holds its shard before any answers
        return model, tokenizer
    return load


def _pause_watchdog_while_loading(world: Any, slot: Any) -> None:
    """Pause ``world``'s watchdog for each whole load of ``slot`` (a
    :class:`kit.engine.decode.slot.ModelSlot`): importing mlx-lm, reading the shard, the warm-up
    generation and the tokenizer's prompt bound, none of which passes a sync point. On
    2 busy cores that took over 5 s, and a short --rank-timeout ended a world that was
    only loading. The loader alone (``sharded_loader``) covers only the read."""
    load = slot.load

    def paused_load(*args: Any, **kwargs: Any) -> Any:
        world.paused = True
        try:
            return load(*args, **kwargs)
        finally:
            world.paused = False
            world.mark()
    slot.load = paused_load


def _ranks_on_this_host() -> int:
    """How many ranks of this world run on this rank's host: ``MLX_KIT_RANK_HOSTS`` names
    every rank's host, in rank order (``MLX_RANK``, set by mlx.launch)."""
    hosts = (env("MLX_KIT_RANK_HOSTS") or "").split(",")
    try:
        return hosts.count(hosts[int(os.environ.get("MLX_RANK", "0") or 0)])
    except (ValueError, IndexError):
        return 1


def _connect(control: Path) -> Any:
    from multiprocessing.connection import Client

    authkey = (control / "authkey").read_bytes()
    return Client(str(control / "socket"), family="AF_UNIX", authkey=authkey)


def main() -> None:
    """Run this rank until the server says stop, goes away, or a peer is lost."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the server stops us

    try:  # before stdin is closed: a remote rank's secret arrives there
        key = read_world_key()
    except KeyMissing as e:
        _logging(int(os.environ.get("MLX_RANK", "0") or 0))
        _fatal(str(e), 1)
    # mlx.launch waits on each rank's stdin being writable and spins while it is (about
    # 13% of a core per rank, measured with idle ranks); with ours closed, the one byte
    # the server then writes fails with EPIPE and mlx.launch stops watching it.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # Everything a rank writes goes to stdout: the server reads mlx.launch's own reports
    # ("Node with rank N exited ...") from its stderr alone, where no text a model wrote
    # (a log line quoting its output) can pose as one.
    os.dup2(1, 2)

    ranks_here = _ranks_on_this_host()
    threads = share_cores(ranks_here)
    preload_blas()  # before mlx is imported
    from kit.engine.distributed.world import EXIT_PEER_LOST, EXIT_TAMPERED, World, WorldLost, WorldTampered

    backend = env("MLX_KIT_BACKEND", "ring") or "ring"
    pipeline = env("MLX_KIT_PIPELINE") == "1"
    timeout = float(env("MLX_KIT_RANK_TIMEOUT", "300") or 300)
    try:  # mlx.launch's "jaccl-ring" (a host file may name it) is mx's "jaccl"
        world = World.init("jaccl" if backend.startswith("jaccl") else backend, timeout,
                           key)
    except RuntimeError as e:
        _logging(int(os.environ.get("MLX_RANK", "0") or 0))
        _fatal(f"cannot join the {backend} group: {e}", 1)
    _logging(world.rank)
    if threads is not None:
        log.info("%d ranks on this host: %d BLAS thread(s) each", ranks_here, threads)
    conn = None
    try:
        # before anything crosses the ring, and before rank 0 tells the server the world
        # is up (it serves nothing until then): every link is ours (check_ring_peers, where
        # it can tell), every rank holds the secret (prove)
        if backend == "ring":
            check_ring_peers(world)
        world.prove()
        setup = None
        if world.rank == 0:
            conn = _connect(Path(env("MLX_KIT_CONTROL") or ""))

            try:  # a kit.engine.proc.wire record, never a pickle
                kind, *init = wire.recv(conn, wire.TO_ENGINE_MAX)
            except (wire.WireError, EOFError, OSError) as e:
                _fatal(f"the server's first message was refused: {e}", 1)
            if kind != "init":
                _fatal(f"the server's first message was {kind!r}, not init", 1)
            setup = setup_of(*init)
        setup = world.share(Setup, setup)
        model, config, level = (ModelInfo(setup.model_id, Path(setup.model_path),
                                          setup.context_window),
                                setup.options, setup.log_level)
        # a follower's request lines repeat rank 0's: only its warnings, unless debugging
        logging.getLogger("mlx_kit").setLevel(
            level if world.rank == 0 or level <= logging.DEBUG else max(level, logging.WARNING))
        world.seed()
        # Paused until the first load ends (see _pause_watchdog_while_loading): importing
        # the engine before it passes no sync point either.
        world.paused = True
        world.start_watchdog()
        _run(world, conn, model, config, backend, pipeline)
        if world.rank == 0:
            _remove_control(Path(env("MLX_KIT_CONTROL") or ""))
    except WorldTampered as e:
        _fatal(f"{e}; this rank stops", EXIT_TAMPERED)
    except WorldLost as e:
        _fatal(f"{e}; this rank stops (a peer exited or cannot be reached)", EXIT_PEER_LOST)
    _fatal_free_exit()


def _remove_control(control: Path) -> None:
    """Remove the server's control directory (its socket and authkey) once rank 0's work
    ended: the server removes it when it stops the world, but a server that was killed
    (SIGKILL) cannot, and the authkey must not outlive the world. Only a directory named
    as the server makes them (``mlx-kit-ranks-*``) is touched."""
    import shutil

    if control.name.startswith("mlx-kit-ranks-"):
        shutil.rmtree(control, ignore_errors=True)


def _check_alike(world: Any) -> None:
    """End every rank when they differ in what decides their steps: mlx, mlx-lm and
    mlx-kit versions, the device kind and the prefill chunk size (a GPU rank prefills in
    larger chunks than a CPU one: their sync points would differ)."""
    import mlx.core as mx
    from importlib.metadata import version

    mine = Alike(mlx=version("mlx"), mlx_lm=version("mlx-lm"), kit=__version__,
                 device=str(mx.default_device()), prefill=prefill_step_size())
    every = world.gather(Alike, mine)
    if any(other != every[0] for other in every):
        names = "mlx, mlx-lm, mlx-kit, device, prefill chunk"
        rows = "; ".join(f"rank {r}: {', '.join(map(str, e.model_dump().values()))}"
                         for r, e in enumerate(every))
        _fatal(f"the ranks differ ({names}): {rows}; install the same versions on every "
               "host", 1)


def _local_model(world: Any, model: Any) -> Any:
    """Rank 0's model as this rank finds it: the same folder when it exists here, else
    the same model id resolved in this host's own cache (another HOME or HF_HOME)."""
    if world.rank == 0 or Path(str(model.path)).exists():
        return model

    try:
        return resolve_model(model.id)
    except Exception as e:
        _fatal(f"rank {world.rank} ({world.host}): {model.id} is not on this host "
               f"({model.path} does not exist; {e})", 1)
    raise AssertionError  # unreachable


def _fatal_free_exit() -> None:
    logging.shutdown()
    os._exit(0)  # no interpreter teardown: mlx's group would be torn down under peers


def _run(world: Any, conn: Any, model: Any, config: Any, backend: str,
         pipeline: bool) -> None:
    from kit.engine.distributed.rank_inbox import RankInbox

    listed = (env("MLX_KIT_RANK_HOSTS") or "").split(",")
    host = listed[world.rank] if world.rank < len(listed) else world.host

    def ranks() -> dict[str, Any]:
        """Every rank's host, pid and memory (collective: at every state change)."""
        mine = RankFacts(rank=world.rank, host=host, hostname=world.host, pid=os.getpid(),
                         memory=engine.memory())

        if engine.state != "loading":  # the first load is over, whatever its outcome
            world.paused = False
            world.mark()
        return {"distributed": {"world_size": world.size, "backend": backend,
                                "mode": "pipeline" if pipeline else "tensor",
                                "ranks": [r.model_dump()
                                          for r in world.gather(RankFacts, mine)]}}

    _check_alike(world)
    machine = Machine(host=world.host, node=uuid.getnode())  # two hosts may share a name
    machines = world.gather(Machine, machine)
    model = _local_model(world, model)

    def fatal(error: BaseException) -> None:
        _fatal(f"rank {world.rank} ({world.host}): generation failed: "
               f"{type(error).__name__}: {error}", 1)

    extra = {"inbox": RankInbox(world), "loader": sharded_loader(world, pipeline),
             "agree": world.agree, "on_fatal": fatal,
             "split": (world.rank, world.size, pipeline, machines.count(machine))}
    if world.rank == 0:
        server = _PipeServer(conn, model, config, extra_state=ranks, **extra)
        engine = server.engine
        threading.Thread(target=server.read_commands, name="mlx-kit-engine-pipe",
                         daemon=True).start()
    else:
        engine = Engine(model, config, on_change=ranks, **extra)
    _pause_watchdog_while_loading(world, engine.slot)
    engine.run_worker()


if __name__ == "__main__":
    main()
