"""``mlx-kit launch AGENT [-- agent args]``: reuse or start the server, configure, exec."""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

import typer

from kit.cli.console import err_console
from kit.cli.options import TRUST_REMOTE_CODE, URL, WARMUP, WarmUp
from kit.errors import AgentNotInstalledError, ConfigError


def launch(
    ctx: typer.Context,
    agent: str = typer.Argument(..., help="Agent to run, e.g. pi."),
    url: Optional[str] = URL,
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Model behind 'local': a server we start "
                                             "loads it, a running one swaps to it."),
    timeout: float = typer.Option(600.0, "--timeout", min=1,
                                  help="Seconds to wait for the server."),
    trust_remote_code: bool = TRUST_REMOTE_CODE,
    ranks: Optional[int] = typer.Option(None, "--ranks", min=1, help="A server this "
                                        "command starts spreads the model over N ranks "
                                        "(as `serve --ranks`)."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="HOST[,HOST...] for the ranks "
                                        "of a server this command starts (as `serve`)."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", help="An mlx.launch host "
                                           "file for a server this command starts."),
    backend: Optional[str] = typer.Option(None, "--backend", help="ring, jaccl, mpi or "
                                          "nccl, for a server this command starts."),
    pipeline: bool = typer.Option(False, "--pipeline", help="Pipeline parallelism, for a "
                                  "server this command starts."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="Memory "
                                                "ceiling, e.g. 8GB, for a server this "
                                                "command starts (as `serve`)."),
    prompt_cache_bytes: Optional[str] = typer.Option(None, "--prompt-cache-bytes",
                                                     help="Prompt caches' byte bound for a "
                                                     "server this command starts."),
    prompt_cache_dir: Optional[str] = typer.Option(
        None, "--prompt-cache-dir", help="The prompt cache's disk folder, for a server this "
        "command starts (as `serve`)."),
    prompt_cache_disk: Optional[str] = typer.Option(
        None, "--prompt-cache-disk", help="The prompt cache's disk bound (0: none), for a "
        "server this command starts (as `serve`)."),
    warmup: WarmUp = WARMUP,
    kv_bits: Optional[int] = typer.Option(None, "--kv-bits", help="Quantize the KV cache to "
                                          "8 or 4 bits, for a server this command starts "
                                          "(as `serve --kv-bits`)."),
    kv_group_size: Optional[int] = typer.Option(None, "--kv-group-size", help="Group size "
                                                "of the quantized KV cache (32, 64, 128), "
                                                "for a server this command starts."),
) -> None:
    """Run AGENT against the local server; arguments after `--` go to the agent.

    It starts a server if none runs (or reuses it), configures AGENT for it and then
    becomes AGENT: its stdout is the agent's, so launch has no --json (use `mlx-kit status
    --json` for the server it used). Agents: see `mlx-kit harness list`.
    """
    from kit.daemon import ensure_server
    from kit.engine.distributed.hosts import plan_world
    from kit.harness import install as hi
    from kit.harness.spec_loader import load_spec
    from kit.urls import parse_url

    spec = load_spec(agent)
    binary = shutil.which(spec.binary)
    if binary is None:
        raise AgentNotInstalledError(f"{spec.binary} ({spec.description}) is not installed",
                                     hint=spec.install)
    # checked here, as serve checks them, so bad flags fail before a server starts
    world = plan_world(ranks, hosts, hostfile, backend, pipeline, 300)
    from kit.engine.cache.kv import check_kv
    from kit.engine.decode.warmup import check_mode

    check_mode(warmup.value, distributed=world is not None)
    check_kv(kv_bits, kv_group_size or 64)
    serve_args = (["--trust-remote-code"] if trust_remote_code else []) + _world_args(
        ranks, hosts, hostfile, backend, pipeline) + _memory_args(memory_budget,
                                                                  prompt_cache_bytes) \
        + _cache_args(prompt_cache_dir, prompt_cache_disk) + (
        ["--warmup", warmup.value] if warmup != WarmUp.auto else []) \
        + _kv_args(kv_bits, kv_group_size)
    u = parse_url(url)
    with err_console.status(f"connecting to {u.root}") as spinner:
        probe, started = ensure_server(u, model, timeout,
                                       on_wait=lambda line: spinner.update(f"server {line}"),
                                       serve_args=serve_args or None)
    health = probe.health or {}
    if trust_remote_code and not started:
        # the flag is the server's: a server already running keeps what it was started with
        err_console.print("warning: --trust-remote-code applies to a server this command "
                          "starts; the running one keeps its own setting (`mlx-kit stop`, "
                          "then launch again with the flag, if a model needs it)")
    if not started and (differs := _world_differs(world, health.get("distributed"))):
        err_console.print(f"warning: the running server keeps its layout ({differs}); the "
                          "--ranks/--hosts/--hostfile/--backend/--pipeline flags apply to a "
                          "server this command starts (`mlx-kit stop`, then launch again "
                          "with them)", markup=False)
    running_kv = (health.get("kv_cache") or {}).get("bits")
    if not started and kv_bits is not None and running_kv != kv_bits:
        err_console.print(f"warning: the running server keeps its KV cache "
                          f"({f'{running_kv} bits' if running_kv else 'full precision'}); "
                          "--kv-bits applies to a server this command starts (`mlx-kit "
                          "stop`, then launch again with it)", markup=False)
    if model and not started and model not in (health.get("model"), str(health.get("model"))):
        from kit.daemon import admin_swap

        with err_console.status(f"swapping the server to {model}"):
            result = admin_swap(u, model)
        health["model"] = result["model"]
    err_console.print(f"{'started' if started else 'reusing'} mlx-kit server {u.v1} "
                      f"(pid {health.get('pid')}): local -> {health.get('model')}")
    if started:
        err_console.print("the server keeps running in the background for the next launch; "
                          "`mlx-kit stop` ends it")
    from kit.probe import fetch_status

    if fetch_status(u, os.environ.get("MLX_KIT_API_KEY")) == 401:
        raise ConfigError(f"the server at {u.root} requires an API key",
                          hint="export MLX_KIT_API_KEY=<the server's --api-key>")
    try:
        result = hi.install(spec, u)
    except hi.EditedFileError as e:  # keep the user's edits; the agent still runs
        from rich.markup import escape

        err_console.print(f"[yellow]warning:[/] {escape(e.message)} ({escape(e.hint or '')})",
                          highlight=False)
    else:
        for path in result.written:
            err_console.print(f"configured {spec.name}: {path}", markup=False)
    local = None
    if spec.uses_model_limits:  # e.g. Goose's output limit, an env var of the launch
        models, _ = hi.baked_models(u)
        local = models[0] if models else None
    argv, extra_env = spec.launch_command(binary, ctx.args, local=local, root_url=u.root)
    os.execvpe(binary, argv, {**os.environ, **extra_env})


def _memory_args(memory_budget: str | None, prompt_cache_bytes: str | None) -> list[str]:
    """The ``serve`` memory options given, each checked first (ConfigError: not a size),
    so a bad one fails before a server starts."""
    from kit.models.memory import parse_size

    args: list[str] = []
    for flag, value in (("--memory-budget", memory_budget),
                        ("--prompt-cache-bytes", prompt_cache_bytes)):
        if value is not None:
            parse_size(value)
            args += [flag, value]
    return args


def _cache_args(folder: str | None, disk: str | None) -> list[str]:
    """The ``serve`` options of the prompt cache's disk tier (the folder made absolute, as
    the host file is; the size and the folder checked here, so a bad one fails before a
    server starts).

    Raises:
        ConfigError: ``disk`` is not a size, or the folder is one others can write.
    """
    from pathlib import Path

    from kit.cli.options import check_cache_dir, disk_size

    args: list[str] = []
    bound = disk_size(disk) if disk is not None else 1
    if folder is not None:
        check_cache_dir(folder, bound)  # before a server starts, as `serve` would refuse
        args += ["--prompt-cache-dir", str(Path(folder).expanduser().resolve())]
    if disk is not None:
        args += ["--prompt-cache-disk", disk]
    return args


def _world_args(ranks: int | None, hosts: str | None, hostfile: str | None,
                backend: str | None, pipeline: bool) -> list[str]:
    """The ``serve`` options for the distributed flags given (the host file made absolute:
    the server it starts may resolve it from another directory)."""
    from pathlib import Path

    args: list[str] = []
    if ranks is not None:
        args += ["--ranks", str(ranks)]
    if hosts is not None:
        args += ["--hosts", hosts]
    if hostfile is not None:
        args += ["--hostfile", str(Path(hostfile).expanduser().resolve())]
    if backend is not None:
        args += ["--backend", backend]
    if pipeline:
        args.append("--pipeline")
    return args


def _kv_args(kv_bits: int | None, kv_group_size: int | None) -> list[str]:
    """The ``serve`` options for ``--kv-bits`` / ``--kv-group-size`` when given."""
    return ((["--kv-bits", str(kv_bits)] if kv_bits is not None else [])
            + (["--kv-group-size", str(kv_group_size)] if kv_group_size is not None else []))


def _world_differs(world: Any, running: dict | None) -> str | None:
    """How the running server's world (/health's ``distributed``, None for a single
    process) differs from the one the flags ask for (a ``WorldPlan`` or None), as the
    text of a warning; None when it is the same or no flag asked for one. Compared:
    world size, backend and mode (/health names each rank's host by its host name, the
    flags by address, so hosts are not compared)."""
    if world is None:
        return None
    if not running:
        return f"one process, not {world.size} {world.backend} ranks"
    have = (running.get("world_size"), running.get("backend"), running.get("mode"))
    want = (world.size, world.backend, world.mode)
    if have == want or (not world.pipeline and have[:2] == want[:2]
                        and have[2] == "pipeline"):  # serve's fallback to a layer split
        return None
    return (f"{have[0]} {have[1]} ranks, {have[2]} parallel; asked for {want[0]} {want[1]} "
            f"ranks, {want[2]} parallel")
