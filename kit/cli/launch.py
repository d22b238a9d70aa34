"""``mlx-kit launch AGENT [-- agent args]``: reuse or start the server, configure, exec."""

from __future__ import annotations

import os
import shutil
from typing import Optional

import typer

from kit.cli.console import err_console
from kit.cli.options import TRUST_REMOTE_CODE, URL
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
) -> None:
    """Run AGENT against the local server; arguments after `--` go to the agent."""
    from kit.daemon import ensure_server
    from kit.harness import install as hi
    from kit.harness.spec_loader import load_spec
    from kit.urls import parse_url

    spec = load_spec(agent)
    binary = shutil.which(spec.binary)
    if binary is None:
        raise AgentNotInstalledError(f"{spec.binary} ({spec.description}) is not installed",
                                     hint=spec.install)
    u = parse_url(url)
    with err_console.status(f"connecting to {u.root}") as spinner:
        probe, started = ensure_server(u, model, timeout,
                                       on_wait=lambda line: spinner.update(f"server: {line}"),
                                       serve_args=["--trust-remote-code"]
                                       if trust_remote_code else None)
    health = probe.health or {}
    if trust_remote_code and not started:
        # the flag is the server's: a server already running keeps what it was started with
        err_console.print("warning: --trust-remote-code applies to a server this command "
                          "starts; the running one keeps its own setting (`mlx-kit stop`, "
                          "then launch again with the flag, if a model needs it)")
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
