"""``mlx-kit serve``: run the server in the foreground."""

from __future__ import annotations

import concurrent.futures
import errno
import ipaddress
import logging
import secrets
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from kit.cli.api_key import resolve_api_key
from kit.cli.config_options import takes_config
from kit.cli.console import err_console
from kit.cli.options import check_cache_dir
from kit.errors import ConfigError, ModelError, PortInUseError, ServerError
from kit.knobs import LogLevel

if TYPE_CHECKING:
    from kit.config import EngineConfig


_FIRST_SCAN_WAIT_S = 60.0  # a hub cache on a slow disk: listen anyway, requests await it


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


def _edge_policy(config: EngineConfig):
    """The Host/Origin policy of ``--allow-host``/``--allow-origin`` (or MLX_KIT_HOSTS /
    MLX_KIT_ORIGINS) and the bind address.

    Raises:
        ConfigError: an origin is not ``scheme://host[:port]``.
    """
    from kit.server.guard import EdgePolicy

    try:
        return EdgePolicy.build(config.host, config.port, list(config.allow_host),
                                list(config.allow_origin), config.max_body_size)
    except ValueError as e:
        raise ConfigError(f"--allow-origin: {e}",
                          hint="e.g. --allow-origin http://localhost:3000") from None


def check_startable(config: EngineConfig, world: Any) -> None:
    """What ``serve`` (and ``launch``, before it starts one) refuses beyond the config's own
    validation: a warm-up mode the world does not allow, a disk-tier folder others can
    write, an adapter folder that is not mlx-lm's format, an ``--image-dir`` that is not
    a folder.

    Raises:
        ConfigError: naming the flag (and the adapter's file).
    """
    from kit.engine.decode.warmup import check_mode
    from kit.models.adapters import parse_adapters
    from kit.server.content.image_files import allowed_folders

    check_mode(config.warmup.value, distributed=world is not None)
    check_cache_dir(config.prompt_cache_dir, config.prompt_cache_disk)
    parse_adapters(config.adapter)  # each folder checked now, naming the file
    allowed_folders(config.image_dir)


def check_drafts(specs: tuple[str, ...], info: Any) -> None:
    """Resolve each ``--draft-model`` draft and target (a folder, or a hub id in the local
    cache) and refuse, before the engine starts, a draft for the model served now that is
    a vision model or whose tokenizer differs from its
    (:func:`kit.engine.decode.draft.check_same_tokenizer`).

    Raises:
        ConfigError: a draft or target cannot be found, the model served is a vision
            model, or the tokenizers differ (naming both).
    """
    from kit.engine.decode.draft import check_same_tokenizer, parse_pairings
    from kit.models.resolve import resolve_model
    from kit.models.vision import is_vision_model

    for target, spec in parse_pairings(specs, info.id).items():
        try:
            draft = resolve_model(spec)
            if target != info.id:  # a typo would turn drafting off without a word
                resolve_model(target)
        except ModelError as e:
            shown = spec if target == info.id and spec in specs else f"{target}={spec}"
            raise ConfigError(f"--draft-model {shown}: {e.message}", hint=e.hint) from None
        if target == info.id:
            if is_vision_model(info.path):
                raise ConfigError(f"--draft-model: {info.id} is a vision model (mlx-vlm "
                                  "decodes it), which mlx-kit does not draft for",
                                  hint="serve it without --draft-model")
            check_same_tokenizer(info, draft)


def unused_flags(config: EngineConfig, flags_given: frozenset[str]) -> list[str]:
    """Warnings for settings given that do nothing with the rest (``flags_given``: the
    field names set on the command line; a knob's variable counts as given too)."""
    from kit.knobs import env

    if not config.draft_model and ("num_draft_tokens" in flags_given
                                   or env("MLX_KIT_NUM_DRAFT_TOKENS") is not None):
        return ["--num-draft-tokens has no effect without --draft-model"]
    return []


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


@takes_config("serve")
def serve(config: EngineConfig, flags_given: frozenset[str]) -> None:
    """Run the OpenAI- and Anthropic-compatible server in the foreground (Ctrl-C stops it)."""
    c = config
    host, port = c.host, c.port
    api_key = resolve_api_key(c.secret("api_key"), c.api_key_file,
                              lambda line: err_console.print(line, markup=False, highlight=False),
                              from_argv="api_key" in flags_given)
    if not _is_loopback(host) and not api_key:
        raise ConfigError(f"refusing to listen on {host} without an API key",
                          hint="pass --api-key-file PATH (or set MLX_KIT_API_KEY), or bind "
                               "127.0.0.1")
    from kit.models.aliases import AliasTable

    from kit.engine.distributed.hosts import plan_world

    world = plan_world(c.ranks, c.hosts, c.hostfile, c.backend, c.pipeline, c.rank_timeout)
    check_startable(c, world)
    aliases = AliasTable.parse(list(c.alias))
    edge = _edge_policy(c)
    _check_port_free(host, port)
    from kit.logfile import check_log_path, setup_server

    log_file, log_level = c.log_file, c.log_level
    if log_file:  # the path as spelt: a link at it is resolved next, and must be ours
        check_log_path(Path(log_file).expanduser().absolute())
    # Absolute once, here: the pid file stores it for `logs` and `status`, which run in
    # other directories, and the engine process gets it through the environment.
    log_path = Path(log_file).expanduser().resolve() if log_file else None
    setup_server(log_level.value, log_path)
    log = logging.getLogger("mlx_kit.serve")
    for line in unused_flags(c, flags_given):
        log.warning(line)
    if log_path and log_level is LogLevel.debug:
        log.warning("log level debug: the text of every generated answer is written to %s",
                    log_path)

    import uvicorn

    from kit.daemon import remove_pid_file, write_pid_file
    from kit.engine.proc.process import EngineProcess
    from kit.models.resolve import resolve_model
    from kit.server import create_app
    from kit.server.content.image_files import allowed_folders
    from kit.server.content.media import MediaLimits
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

    if c.kv_bits is not None and c.max_batch is None:
        progress(f"--kv-bits {c.kv_bits}: requests decode one at a time (max batch 1): "
                 "mlx-lm's batched decode cannot merge quantized KV caches")
    info = resolve_model(c.model, progress=progress)
    if c.draft_model:
        check_drafts(c.draft_model, info)
    embedder = None
    if c.embed_model:
        from kit.embed.start import start_embedder

        embedder, budget = start_embedder(c.embed_model, c.memory_budget, progress)
        options = c.for_engine(memory_budget=budget)
    else:
        options = c.for_engine()
    if world is None:
        engine = EngineProcess(info, options)
    else:
        from kit.engine.distributed.world_process import DistributedEngine
        world = _choose_split(info, world, progress)  # SplitError: before any rank starts

        # A lost rank ends the server through uvicorn's graceful shutdown (should_exit),
        # not a SIGTERM to ourselves: uvicorn re-raises a signal it caught once it has
        # shut down, so the process would die of SIGTERM before it prints the error and
        # exits 1.
        engine = DistributedEngine(info, world, options, on_lost=lambda _why: end_serving())
        progress(f"starting {world.size} ranks ({world.backend}, {world.mode} parallel)")
    def shutdown() -> None:
        engine.stop()
        if embedder is not None:
            embedder.stop()
        remove_pid_file(url)

    # A SIGTERM (or Ctrl-C) from here until uvicorn runs ends the start-up through the
    # finally below, which stops the engine through its pipe (it ignores SIGTERM: left
    # alone it would end only on its pipe's end-of-file, once this process is gone).
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
                            aliases=aliases, swap_on_request=c.swap_on_request,
                            default_temperature=c.temperature, default_top_p=c.top_p,
                            force_sampling=c.force_sampling, embedder=embedder,
                            adapters=tuple(n.partition("=")[0] for n in c.adapter),
                            adapters_for=info.id,
                            media_limits=MediaLimits(c.max_image_bytes, c.max_image_pixels,
                                                     c.max_images,
                                                     allowed_folders(c.image_dir)))
        # The first catalog scan runs while the engine loads; listening only after it ended
        # means no request ever waits for one (later rescans run in the background).
        concurrent.futures.wait([state.catalog_cache.refresh()], timeout=_FIRST_SCAN_WAIT_S)
        app = create_app(state, on_shutdown=shutdown, edge=edge,
                         docs=_is_loopback(host) if c.docs is None else c.docs)
        web.append(uvicorn.Server(uvicorn.Config(
            app, host=host, port=port, log_config=None, log_level=log_level.value,
            timeout_graceful_shutdown=c.graceful_shutdown_s)))
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
