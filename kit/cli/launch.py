"""``mlx-kit launch AGENT [-- agent args]``: reuse or start the server, configure, exec."""

from __future__ import annotations

import os
import shutil
from typing import Optional

import typer

from kit.cli.console import err_console
from kit.cli.options import URL
from kit.errors import AgentNotInstalledError


def launch(
    ctx: typer.Context,
    agent: str = typer.Argument(..., help="Agent to run, e.g. pi."),
    url: Optional[str] = URL,
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Model behind 'local': a server we start "
                                             "loads it, a running one swaps to it."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for the server."),
) -> None:
    """Run AGENT against the local server; arguments after `--` go to the agent."""
    from kit.daemon import ensure_server
    from kit.harness import install as hi
    from kit.harness.spec import load_spec
    from kit.urls import parse_url

    spec = load_spec(agent)
    binary = shutil.which(spec.binary)
    if binary is None:
        raise AgentNotInstalledError(f"{spec.binary} ({spec.description}) is not installed",
                                     hint=spec.install)
    u = parse_url(url)
    with err_console.status(f"connecting to {u.root}") as spinner:
        probe, started = ensure_server(u, model, timeout,
                                       on_wait=lambda line: spinner.update(f"server: {line}"))
    health = probe.health or {}
    if model and not started and model not in (health.get("model"), str(health.get("model"))):
        from kit.daemon import admin_swap

        with err_console.status(f"swapping the server to {model}"):
            result = admin_swap(u, model)
        health["model"] = result["model"]
    err_console.print(f"{'started' if started else 'reusing'} mlx-kit server {u.v1} "
                      f"(pid {health.get('pid')}): local -> {health.get('model')}")
    result = hi.install(spec, u)
    for path in result.written:
        err_console.print(f"configured {spec.name}: {path}", markup=False)
    argv = [binary, *spec.launch_args, *ctx.args]
    env = {**os.environ, **dict(spec.launch_env)}
    os.execvpe(binary, argv, env)
