"""``mlx-kit serve``: run the server in the foreground."""

from __future__ import annotations

import concurrent.futures
import errno
import ipaddress
from enum import Enum
import logging
import os
import secrets
import signal
import socket
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from kit.cli.api_key import API_KEY, API_KEY_FILE, resolve_api_key
from kit.cli.console import err_console
from kit.cli.options import TRUST_REMOTE_CODE, WARMUP, WarmUp, check_cache_dir, disk_size
from kit.errors import ConfigError, PortInUseError, ServerError


_FIRST_SCAN_WAIT_S = 60.0  # a hub cache on a slow disk: listen anyway, requests await it


class LogLevel(str, Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as e:
            raise ConfigError(f"cannot listen on {host}: {e.strerror}",
                              hint="--host must be an address of this machine") from None
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUseError(f"cannot listen on {host}:{port}: {e.strerror}",
                                     hint="another server holds it; use --port") from None
            raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}",
                              hint="--host must be an address of this machine") from None


def _env_list(name: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]


def _edge_policy(host: str, port: int, allow_host: list[str] | None,
                 allow_origin: list[str] | None, max_body_size: int):
    """The Host/Origin policy from the flags and MLX_KIT_HOSTS / MLX_KIT_ORIGINS.

    Raises:
        ConfigError: an origin is not ``scheme://host[:port]``.
    """
    from kit.server.guard import EdgePolicy

    try:
        return EdgePolicy.build(host, port, [*(allow_host or []), *_env_list("MLX_KIT_HOSTS")],
                                [*(allow_origin or []), *_env_list("MLX_KIT_ORIGINS")],
                                max_body_size)
    except ValueError as e:
        raise ConfigError(f"--allow-origin: {e}",
                          hint="e.g. --allow-origin http://localhost:3000") from None


def _choose_split(info, world, progress):
    """The parallelism the model supports: tensor unless ``--pipeline`` was asked for, or
    pipeline when mlx-lm cannot split this model by tensors (no tensor mode for its type,
    or a dimension the rank count does not divide) but can by layers.

    Raises:
        SplitError: neither way works (the tensor split's reason).
    """
    from dataclasses import replace

    from kit.models.split import SplitError, plan_split

    try:
        plan_split(info.path, world.size, world.pipeline)
        return world
    except SplitError as e:
        if world.pipeline:
            raise
        try:
            plan_split(info.path, world.size, True)
        except SplitError:
            raise e from None
        progress(f"{e.message}: splitting {info.id} by layers instead (pipeline parallel)")
        return replace(world, pipeline=True)


def _say_ready(engine, model_id: str, root: str, progress) -> None:
    """On a thread: one startup line once the first load is over (ready or failed; a
    failure was logged by the engine already)."""
    if engine.wait_ready():
        took = engine.load_seconds
        progress(f"ready: {model_id} as 'local' on {root}/v1"
                 + (f" (loaded in {took:.1f} s)" if took is not None else ""))


class _StoppedEarly(Exception):
    """A SIGTERM before uvicorn took over (the start-up is unwound, the engine stopped)."""


def _stop_early(_sig: int, _frame: Any) -> None:
    """The SIGTERM handler while the server starts: unwinds the start-up (raises
    :class:`_StoppedEarly` in the main thread); a second SIGTERM ends the process."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise _StoppedEarly()


def _stop_once(server) -> Callable[[int, Any], None]:
    """A SIGTERM handler for while uvicorn runs: uvicorn handles the signal itself (a
    graceful shutdown), then re-raises it to the handler it replaced, this one. A stop that
    was asked for and done exits 0 (as nginx's and PostgreSQL's do), not as a death by
    SIGTERM (143 in the shell, outside :class:`kit.errors.ExitCode`); a SIGTERM before
    uvicorn took over stops it too. Once called, the next SIGTERM ends the process."""
    def handler(_sig: int, _frame: Any) -> None:
        server.should_exit = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return handler


def serve(
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Hub repo id in the local cache, or a model folder. "
                                             "Default: the embedded starter."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind. Anything but "
                             "loopback needs an API key (--api-key-file)."),
    port: int = typer.Option(8090, "--port", min=1, max=65535, help="TCP port."),
    api_key_file: Optional[str] = API_KEY_FILE,
    api_key: Optional[str] = API_KEY,
    ttl: float = typer.Option(0, "--ttl", min=0, help="Unload the model after this many idle "
                              "seconds; the next request reloads it (0: never)."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="Most memory a "
                                                "model may need, e.g. 8GiB (binary) or 8GB "
                                                "(10^9 bytes) (default: what is available)."),
    swap_on_request: bool = typer.Option(False, "--swap-on-request", help="A request naming "
                                         "another cached model swaps to it (default: 404)."),
    alias: Optional[List[str]] = typer.Option(None, "--alias", help="PATTERN=TARGET: serve "
                                              "model names matching PATTERN with TARGET "
                                              "(local or a model id). Repeatable; claude-*, "
                                              "gpt-* -> local are built in."),
    max_batch: Optional[int] = typer.Option(None, "--max-batch", min=1, help="Most requests "
                                            "decoded together (continuous batching); 1: one "
                                            "at a time. Default: 8; 1 with --kv-bits."),
    kv_bits: Optional[int] = typer.Option(None, "--kv-bits", help="Quantize the KV cache to "
                                          "8 or 4 bits (about 1/2 or 1/4 of a 16-bit cache's "
                                          "memory); requests then decode one at a time."),
    kv_group_size: int = typer.Option(64, "--kv-group-size", help="Values per scale and "
                                      "bias of the quantized KV cache: 32, 64 or 128."),
    prompt_cache_size: int = typer.Option(4, "--prompt-cache-size", min=1,
                                          help="Prompt caches (KV of earlier requests) kept."),
    prompt_cache_bytes: Optional[str] = typer.Option(
        None, "--prompt-cache-bytes", help="Most memory the prompt caches hold together, "
        "e.g. 2GB; least recently used evicted first (default: a quarter of the memory "
        "ceiling left after the weights)."),
    prompt_cache_dir: Optional[str] = typer.Option(
        None, "--prompt-cache-dir", help="Folder of the prompt cache's disk tier, one only "
        "you can write (refused otherwise; default: prompt-cache/ in mlx-kit's cache dir)."),
    prompt_cache_disk: str = typer.Option(
        "10GiB", "--prompt-cache-disk", help="Most disk the prompt cache keeps KV caches "
        "of long prompts in, e.g. 10GiB, so they survive restarts and swaps (0: none)."),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", min=0, max=2, envvar="MLX_KIT_TEMPERATURE",
        help="Sampling temperature for requests that set none (default: the model's "
             "generation_config.json, else 0.7)."),
    top_p: Optional[float] = typer.Option(
        None, "--top-p", min=0, max=1,
        help="Nucleus sampling mass for requests that set none (default: the model's, else 1)."),
    allow_host: Optional[List[str]] = typer.Option(
        None, "--allow-host", help="Also accept requests whose Host header is NAME "
        "(repeatable; also MLX_KIT_HOSTS, comma-separated). Loopback names and the bound "
        "address are always accepted; .example.com: the domain and its subdomains; *: any."),
    allow_origin: Optional[List[str]] = typer.Option(
        None, "--allow-origin", help="Let web pages of ORIGIN (scheme://host[:port]) call the "
        "API, with CORS (repeatable; also MLX_KIT_ORIGINS, comma-separated; *: any page, "
        "unsafe). Other requests carrying an Origin are refused."),
    max_body_size: str = typer.Option("16MiB", "--max-body-size", envvar="MLX_KIT_MAX_BODY_SIZE",
                                      help="Largest request body, e.g. 16MiB (413 above it)."),
    docs: Optional[bool] = typer.Option(None, "--docs/--no-docs", help="Serve /openapi.json "
                                        "and /docs (default: on for a loopback bind)."),
    trust_remote_code: bool = TRUST_REMOTE_CODE,
    ranks: Optional[int] = typer.Option(None, "--ranks", min=1, help="Spread the model over "
                                        "N ranks with mlx.distributed (alone: N ranks on "
                                        "this machine; with --hosts: the total)."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="HOST[,HOST...]: the machines "
                                        "of the ranks, this one first (ring: IP addresses)."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", help="An mlx.launch host file "
                                           "(mlx.distributed_config writes one); one entry "
                                           "per rank."),
    backend: Optional[str] = typer.Option(None, "--backend", help="ring (TCP, default), "
                                          "jaccl (Thunderbolt RDMA), mpi or nccl (CUDA)."),
    pipeline: bool = typer.Option(False, "--pipeline", help="Pipeline parallelism (layers "
                                  "split over ranks) instead of tensor parallelism."),
    rank_timeout: float = typer.Option(300, "--rank-timeout", min=5, help="Seconds a rank "
                                       "waits for the others before the server ends."),
    warmup: WarmUp = WARMUP,
    log_file: Optional[str] = typer.Option(
        None, "--log-file", help="Log to FILE (and the engine's output too) instead of "
        "stderr; rotated at 10 MiB, 3 backups kept (FILE.1 to FILE.3). `mlx-kit logs` "
        "reads it."),
    log_level: LogLevel = typer.Option(
        LogLevel.info, "--log-level", envvar="MLX_KIT_LOG_LEVEL", case_sensitive=False,
        help="debug also writes the whole text of every answer the model generates to the "
             "log (the log file, for a detached server), so what prompts and answers "
             "contained ends up on disk."),
) -> None:
    """Run the OpenAI- and Anthropic-compatible server in the foreground (Ctrl-C stops it)."""
    api_key = resolve_api_key(api_key, api_key_file,
                              lambda line: err_console.print(line, markup=False, highlight=False))
    if not _is_loopback(host) and not api_key:
        raise ConfigError(f"refusing to listen on {host} without an API key",
                          hint="pass --api-key-file PATH (or set MLX_KIT_API_KEY), or bind "
                               "127.0.0.1")
    from kit.models.aliases import AliasTable
    from kit.models.memory import parse_size

    from kit.engine.distributed.hosts import plan_world
    from kit.engine.decode.warmup import check_mode

    from kit.engine.cache.kv import check_kv, resolve_max_batch

    check_kv(kv_bits, kv_group_size)
    batch = resolve_max_batch(max_batch, kv_bits)  # ConfigError naming both flags
    world = plan_world(ranks, hosts, hostfile, backend, pipeline, rank_timeout)
    check_mode(warmup.value, distributed=world is not None)
    aliases = AliasTable.parse(alias or [])
    budget = parse_size(memory_budget) if memory_budget else None
    disk_bytes = disk_size(prompt_cache_disk)
    check_cache_dir(prompt_cache_dir, disk_bytes)
    edge = _edge_policy(host, port, allow_host, allow_origin, parse_size(max_body_size))
    _check_port_free(host, port)
    from kit.logfile import check_log_path, setup_server

    if log_file:  # the path as spelt: a link at it is resolved next, and must be ours
        check_log_path(Path(log_file).expanduser().absolute())
    # Absolute once, here: the pid file stores it for `logs` and `status`, which run in
    # other directories, and the engine process gets it through the environment.
    log_path = Path(log_file).expanduser().resolve() if log_file else None
    setup_server(log_level.value, log_path)
    log = logging.getLogger("mlx_kit.serve")
    if log_path and log_level is LogLevel.debug:
        log.warning("log level debug: the text of every generated answer is written to %s",
                    log_path)

    import uvicorn

    from kit.daemon import remove_pid_file, write_pid_file
    from kit.engine.proc.process import EngineProcess
    from kit.models.resolve import resolve_model
    from kit.server import create_app
    from kit.server.state import ServerState
    from kit.urls import parse_url

    url = parse_url(f"http://{'[' + host + ']' if ':' in host else host}:{port}")

    def progress(line: str) -> None:
        log.info(line)
        if not log_file:  # in the foreground, also show it plainly
            err_console.print(line)

    lost = threading.Event()
    web: list[uvicorn.Server] = []

    def end_serving() -> None:
        """Called (from a thread) when a distributed world is lost."""
        lost.set()
        for w in web:
            w.should_exit = True

    if kv_bits is not None and max_batch is None:
        progress(f"--kv-bits {kv_bits}: requests decode one at a time (max batch 1): "
                 "mlx-lm's batched decode cannot merge quantized KV caches")
    info = resolve_model(model, progress=progress)
    options = dict(prompt_cache_size=prompt_cache_size,
                   prompt_cache_bytes=parse_size(prompt_cache_bytes)
                   if prompt_cache_bytes else None, ttl=ttl or None,
                   memory_budget=budget, max_batch=batch,
                   trust_remote_code=trust_remote_code, prompt_cache_dir=prompt_cache_dir,
                   prompt_cache_disk_bytes=disk_bytes, warmup=warmup.value, kv_bits=kv_bits,
                   kv_group_size=kv_group_size)
    if world is None:
        engine = EngineProcess(info, **options)
    else:
        from kit.engine.distributed.world_process import DistributedEngine
        world = _choose_split(info, world, progress)  # SplitError: before any rank starts

        # A lost rank ends the server through uvicorn's graceful shutdown (should_exit),
        # not a SIGTERM to ourselves: uvicorn re-raises a signal it caught once it has
        # shut down, so the process would die of SIGTERM before it prints the error and
        # exits 1.
        engine = DistributedEngine(info, world, on_lost=lambda _why: end_serving(), **options)
        progress(f"starting {world.size} ranks ({world.backend}, {world.mode} parallel)")
    def shutdown() -> None:
        engine.stop()
        remove_pid_file(url)

    # A SIGTERM (or Ctrl-C) from here until uvicorn runs ends the start-up through the
    # finally below, which stops the engine: a daemon engine left to multiprocessing's exit
    # hook would hang it (the engine ignores SIGTERM and waits for the pipe).
    signal.signal(signal.SIGTERM, _stop_early)
    try:
        engine.start()
        admin_token = secrets.token_urlsafe(24)
        write_pid_file(url, info.id, log_path, admin_token)
        # not "serving": the engine is still loading (and maybe warming) the model; /health
        # says when it is ready
        log.info("starting %s as 'local' on %s/v1 (loading the model)", info.id, url.root)
        threading.Thread(target=_say_ready, args=(engine, info.id, url.root, progress),
                         name="mlx-kit-ready", daemon=True).start()
        state = ServerState(engine, api_key=api_key, admin_token=admin_token,
                            aliases=aliases, swap_on_request=swap_on_request,
                            default_temperature=temperature, default_top_p=top_p)
        # The first catalog scan runs while the engine loads; listening only after it ended
        # means no request ever waits for one (later rescans run in the background).
        concurrent.futures.wait([state.catalog_cache.refresh()], timeout=_FIRST_SCAN_WAIT_S)
        app = create_app(state, on_shutdown=shutdown, edge=edge,
                         docs=_is_loopback(host) if docs is None else docs)
        web.append(uvicorn.Server(uvicorn.Config(
            app, host=host, port=port, log_config=None, log_level=log_level.value,
            timeout_graceful_shutdown=5)))
        if lost.is_set():  # lost while the catalog scan ran
            web[0].should_exit = True
        signal.signal(signal.SIGTERM, _stop_once(web[0]))
        try:
            web[0].run()
        except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: a clean stop
            pass                   # (uvicorn.run swallows it the same way)
    except (KeyboardInterrupt, _StoppedEarly):  # a stop asked for during start-up: exit 0
        pass
    finally:
        shutdown()
    if getattr(engine, "lost", None):
        raise ServerError(engine.lost, hint="see the log for every rank's output")
