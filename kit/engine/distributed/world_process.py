"""The server's side of a distributed engine: :class:`DistributedEngine` starts every rank
with ``mlx.launch`` (:mod:`kit.engine.distributed.rank` on each host) and talks to rank 0 exactly as
:class:`kit.engine.proc.process.EngineProcess` talks to its one engine process.

- Start: a private directory (mode 0700) holds a Unix socket and a random authkey
  (mode 0600); ``mlx.launch`` runs in a session of its own (so Ctrl-C in the terminal does
  not reach the ranks; the server stops them through rank 0) and rank 0 connects to the
  socket. :meth:`DistributedEngine.start` waits for that connection, then the model loads
  on every rank while ``state`` is ``loading``.
- The socket carries the engine process's protocol (:mod:`kit.engine.proc.process`), preceded
  by ``("init", model, options, log_level)``: :mod:`kit.engine.proc.wire` records, never
  pickles. ``multiprocessing.connection``'s authkey handshake (HMAC challenges both ways,
  no pickle) is a second lock: a process of another user cannot open the 0700 directory,
  and one that reaches the socket without the key is refused before any message.
- What the ranks print goes to the server's log, line by line. ``mlx.launch`` reports
  every rank's exit ("Node with rank N exited with code C"); the first rank that exited
  with a status other than :data:`kit.engine.distributed.hosts.EXIT_PEER_LOST` (the status of ranks
  that lost a peer) is the one that failed, and the error names it and its host
  (:mod:`kit.engine.distributed.world_exits`).
- A lost world is not restarted: ``state`` is ``failed``, open requests fail with that
  error, and ``on_lost(error)`` tells the server to end (a model spread over several
  machines needs its operator, not a loop of restarts).
- Stop: ``("stop",)`` to rank 0 ends every rank; if they have not exited after the
  timeout, the whole ``mlx.launch`` process group is terminated (it is ours: we made it).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit.engine.proc import wire
from kit.engine.decode.warmup import check_mode
from kit.engine.distributed.hosts import (
    WorldPlan,
    free_ring_ports,
    python_for_ranks,
)
from kit.engine.distributed.world_codec import KEY_BYTES, KEY_ENV
from kit.engine.distributed.world_exits import _ANSI, RankExits
from kit.engine.proc.launch import Child
from kit.engine.proc.process import EngineProcess, _Link
from kit.engine.types import EngineUnavailable
from kit.errors import ConfigError, ServerError
from kit.models.resolve import ModelInfo
from kit.config import EngineConfig

log = logging.getLogger("mlx_kit.engine")
ranks_log = logging.getLogger("mlx_kit.ranks")

_CONNECT_TIMEOUT_S = 120.0  # every rank imports mlx and joins the group before rank 0 calls


class _Launched(Child):
    """``mlx.launch``'s process: :class:`kit.engine.proc.launch.Child`'s interface (pid,
    exitcode, join, kill), where ending it ends its whole process group."""

    def terminate(self) -> None:
        """SIGTERM to the process group ``mlx.launch`` leads (its local ranks and ssh
        sessions); then SIGKILL to what is left after 5 s: the group while ``mlx.launch``
        still runs, and each of its processes seen before the SIGTERM that still runs
        after it (a stopped rank keeps a SIGTERM pending and outlives ``mlx.launch``;
        psutil checks each one's start time, so no pid reused since is signalled)."""
        import psutil

        try:
            ours = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.Error:
            ours = []
        if self.popen.poll() is not None and not self._session_alive():
            return  # reaped and nothing left in its session: the pid may be anyone's now
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.popen.pid, sig)  # start_new_session: pgid == its pid
            except ProcessLookupError:
                break
            try:
                self.popen.wait(5)
                break
            except subprocess.TimeoutExpired:
                continue
        for p in ours:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
            except psutil.Error:
                pass

    #: a rank takes SIGTERM (only the engine process ignores it): the same end either way
    kill = terminate

    def _session_alive(self) -> bool:
        """Whether a process is still in the session ``mlx.launch`` was started in (its
        ranks, once it is gone): while one is, the group id cannot be anyone else's."""
        import psutil

        for pid in psutil.pids():
            try:
                if os.getsid(pid) == self.popen.pid:
                    return True
            except OSError:
                continue
        return False


class DistributedEngine(RankExits, EngineProcess):
    """:class:`kit.engine.interface.EngineLike` over several ranks (``plan``). State,
    counters, memory and capabilities come from rank 0; ``distributed`` (``/health``)
    is ``{world_size, backend, mode, ranks: [{rank, host, pid, memory}]}`` once the
    ranks reported.

    Args:
        model: what to load first.
        plan: the ranks (:func:`kit.engine.distributed.hosts.plan_world`).
        config: the knobs (:class:`kit.config.EngineConfig`), rank 0 shares them with
            every rank (default: defaults and the environment).
        on_lost: called once, from a thread, with the error when the world is lost.

    Raises:
        ConfigError: ``warmup`` ``on``, or ``prompt_cache_bytes`` set (neither works on
            ranks in lockstep).
    """

    def __init__(self, model: ModelInfo, plan: WorldPlan, config: EngineConfig | None = None,
                 on_lost: Callable[[str], None] | None = None) -> None:
        config = config if config is not None else EngineConfig()
        # ConfigError before any rank starts: the ranks cannot warm up in lockstep
        check_mode(config.warmup.value, distributed=True)
        if config.prompt_cache_bytes is not None:
            # each rank's share of a KV cache has its own size, so a byte bound would
            # evict different caches on different ranks, whose prompts then diverge
            raise ConfigError("--prompt-cache-bytes is not supported with --ranks/--hosts",
                              hint="bound the prompt caches by count (--prompt-cache-size)")
        if config.prompt_cache_disk:
            # each rank holds only its shard of the KV; which file every rank would load
            # is not agreed yet (future work), so the tier is off here (docs/distributed.md)
            log.info("the prompt cache's disk tier is off for a distributed engine")
            config = config.model_copy(update={"prompt_cache_disk": 0})
        super().__init__(model, config)
        self.plan = plan
        self.distributed: dict[str, Any] = {
            "world_size": plan.size, "backend": plan.backend, "mode": plan.mode,
            "ranks": [{"rank": r, "host": h, "hostname": None, "pid": None, "memory": None}
                      for r, h in enumerate(plan.hosts)]}
        self._on_lost = on_lost
        self._exits: list[tuple[int, int | None]] = []  # (rank, code) as mlx.launch said
        self._errors: dict[int, str] = {}  # each rank's last ERROR line
        self._output: threading.Thread | None = None
        self._launcher_output: threading.Thread | None = None
        self._control: Path | None = None
        self._hung: list[int] = []  # ranks still running when we ended mlx.launch's group
        self.lost: str | None = None
        self._ending = False  # rank 0's connection closed: the world is over
        self._launcher_code: int | None = None
        self._said: deque[str] = deque(maxlen=5)  # mlx.launch's last lines of its own

    def start(self) -> None:
        """Start every rank and wait until rank 0 connected (then the model loads).

        Raises:
            ServerError: the ranks did not come up (the reason, from their output).
        """
        # rank 0's first message, as a kit.engine.proc.wire record (checked before any rank
        # starts: an option the ranks do not take fails here)
        init = wire.encode(("init", self.model_info, self.config,
                            logging.getLogger("mlx_kit").getEffectiveLevel()))
        control = Path(tempfile.mkdtemp(prefix="mlx-kit-ranks-"))  # 0700
        self._control = control
        key = control / "authkey"
        authkey = secrets.token_bytes(32)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(authkey)
        from multiprocessing.connection import Listener

        listener = Listener(str(control / "socket"), family="AF_UNIX", authkey=authkey)
        # the world's secret (kit/engine/distributed/world_codec.py): in mlx.launch's environment, which
        # local ranks inherit, and on its stdin, which it forwards to every rank (over ssh
        # to remote ones); never in `env`, which mlx.launch puts on command lines
        world_key = secrets.token_bytes(KEY_BYTES).hex()
        env = {"MLX_KIT_CONTROL": str(control), "MLX_KIT_BACKEND": self.plan.backend,
               "MLX_KIT_PIPELINE": "1" if self.plan.pipeline else "0",
               "MLX_KIT_RANK_TIMEOUT": str(self.plan.timeout),
               "MLX_KIT_RANK_HOSTS": ",".join(self.plan.hosts)}
        port = free_ring_ports(self.plan.size)  # free here; other hosts are most likely alike
        cmd = self.plan.command(python_for_ranks(), port, env)
        log.info("starting %d ranks (%s, %s parallel): %s", self.plan.size,
                 self.plan.backend, self.plan.mode, " ".join(cmd))
        popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 env={**os.environ, **env, KEY_ENV: world_key})
        try:
            assert popen.stdin is not None
            popen.stdin.write(world_key.encode() + b"\n")
            popen.stdin.flush()
        except OSError:  # mlx.launch already exited: _accept reports why
            pass
        launched = _Launched(popen)
        self._output = threading.Thread(target=self._read_output, args=(popen.stdout, False),
                                        name="mlx-kit-ranks-output", daemon=True)
        self._output.start()
        self._launcher_output = threading.Thread(
            target=self._read_output, args=(popen.stderr, True),
            name="mlx-kit-ranks-launcher", daemon=True)
        self._launcher_output.start()
        threading.Thread(target=self._watch_launcher, args=(launched,),
                         name="mlx-kit-ranks-launcher-watch", daemon=True).start()
        conn = self._accept(listener, launched)
        try:  # every rank closed its stdin by now: see kit/engine/distributed/rank.py's main()
            assert popen.stdin is not None
            popen.stdin.write(b"\n")
            popen.stdin.flush()
        except OSError:
            pass
        conn.send_bytes(init)
        self._link = link = _Link(conn, launched)
        threading.Thread(target=self._read, args=(link,), name="mlx-kit-engine-reader",
                         daemon=True).start()

    def _accept(self, listener: Any, launched: _Launched) -> Any:
        """Rank 0's connection; fails when ``mlx.launch`` exits or the ranks take longer
        than :data:`_CONNECT_TIMEOUT_S`."""
        got: list[Any] = []
        done = threading.Event()

        def accept() -> None:
            try:
                got.append(listener.accept())
            except Exception as e:  # closed below, or a peer without the authkey
                got.append(e)
            done.set()
        threading.Thread(target=accept, name="mlx-kit-ranks-accept", daemon=True).start()
        waited = 0.0
        while not done.wait(0.2):
            waited += 0.2
            if launched.exitcode is not None or waited > _CONNECT_TIMEOUT_S:
                break
        listener.close()
        if got and not isinstance(got[0], BaseException):
            return got[0]
        if launched.exitcode is None:
            launched.terminate()
        self._join_readers()
        self._cleanup()
        raise ServerError(f"the {self.plan.size} ranks did not start: {self._why()}",
                          hint="see the log for every rank's output")

    def _read_output(self, stream: Any, launcher: bool) -> None:
        """Every line the ranks (stdout) and mlx.launch (stderr: ``launcher``) print, into
        the log; exits and the ranks' errors noted."""
        for raw in stream:
            line = raw.decode("utf-8", "replace")
            if line.strip():
                ranks_log.info("%s", _ANSI.sub("", line).rstrip())
                if self._note_output(line, launcher) and self._link is not None \
                        and not self._stopping:
                    threading.Thread(target=self._reap, args=(self._link.process,),
                                     name="mlx-kit-ranks-reap", daemon=True).start()

    def _watch_launcher(self, launched: _Launched) -> None:
        """``mlx.launch`` itself exiting (killed, crashed) while its ranks run leaves them
        orphaned and the world unwatched: end its process group (ours, and its ranks are
        still in it), so rank 0's connection closes and the world is reported lost."""
        launched.join()
        self._launcher_code = launched.exitcode
        if self._stopping or self._exits:  # a normal stop, or the ranks' exits explain it
            return
        log.error("mlx.launch (pid %d) exited with code %s while its ranks ran; ending them",
                  launched.pid, launched.exitcode)
        launched.terminate()

    def _reap(self, launched: _Launched) -> None:
        """A rank exited while serving, so the world is over: ``mlx.launch`` ends the
        others, but it waits for ever on a rank that hangs (stopped, or stuck where
        SIGTERM does not reach it), and a hung rank 0 never closes the server's
        connection. After ``rank_reap_s`` seconds (a knob, 15 s), end ``mlx.launch``'s
        process group (ours: it was started in a session of its own), noting which ranks
        still ran."""
        reap_s = self.config.rank_reap_s
        launched.join(reap_s)
        if launched.exitcode is not None or self._stopping:
            return
        exited = {r for r, _ in self._exits}
        self._hung = [r for r in range(self.plan.size) if r not in exited]
        log.error("rank(s) %s still running %.0f s after rank %d exited; ending every rank",
                  ", ".join(map(str, self._hung)), reap_s, self._exits[0][0])
        launched.terminate()

    def _join_readers(self) -> None:
        """Wait (5 s each) for the rank output readers: the exit lines they note come
        after the ranks' ends."""
        for reader in (self._output, self._launcher_output):
            if reader is not None:
                reader.join(5)

    def _cleanup(self) -> None:
        if self._control is not None:
            shutil.rmtree(self._control, ignore_errors=True)
            self._control = None

    def _alive_link(self) -> _Link:
        """The running world's link; a lost world is not restarted.

        Raises:
            EngineUnavailable: the server is stopping or the world was lost.
        """
        with self._start_lock:
            if self._stopping:
                raise EngineUnavailable("the server is shutting down")
            assert self._link is not None, "start() first"
            if self._link.process.exitcode is not None or self.lost or self._ending:
                raise EngineUnavailable(self.lost or self.error
                                        or "the distributed engine has stopped")
            return self._link

    def _gone(self, link: _Link) -> None:
        with self._start_lock:  # no request may start on a world that is ending
            if not self._stopping:
                self._ending = True
                self.state, self.error = "failed", "the distributed engine is stopping: a " \
                    "rank exited (finding out which)"
        # the ranks' exit lines come after rank 0's pipe closed: wait for mlx.launch (and
        # for _reap, which ends it when a rank hangs: up to rank_reap_s, then 5 s for SIGTERM)
        link.process.join(self.config.rank_reap_s + 10)
        self._join_readers()
        self._cleanup()
        super()._gone(link)

    def _after_death(self, link: _Link, code: int | None, error: Any) -> None:
        """The world ended without being asked to: failed, named, and the server told."""
        link.death_handled = True
        self.lost = f"the distributed engine stopped: {self._why()}"
        self.state, self.error = "failed", self.lost
        log.error("%s", self.lost)
        if self._on_lost is not None:
            threading.Thread(target=self._on_lost, args=(self.lost,), daemon=True).start()
