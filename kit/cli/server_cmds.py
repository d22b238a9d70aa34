"""``mlx-kit status`` and ``mlx-kit stop``."""

from __future__ import annotations

from typing import Optional

import typer

from kit.cli.console import console
from kit.cli.options import URL
from kit.errors import PortInUseError, ServerError


def status(url: Optional[str] = URL) -> None:
    """Show whether an mlx-kit server answers, its pid and the model behind 'local'."""
    from kit.daemon import read_pid_file
    from kit.probe import probe
    from kit.urls import parse_url

    u = parse_url(url)
    p = probe(u)
    if p.kind == "none":
        console.print(f"no server at {u.root}")
        raise typer.Exit(3)
    if p.kind == "other":
        raise PortInUseError(f"{u.root} answers but is not mlx-kit ({p.detail})")
    h = p.health or {}
    info = read_pid_file(u) or {}
    log = info.get("log") if info.get("pid") == h.get("pid") else None
    console.print(f"url:     {u.v1}\nstatus:  {h.get('status')} (model {h.get('model_state')})"
                  f"\npid:     {h.get('pid')}\n"
                  f"local -> {h.get('model')} (context window {h.get('context_window')})\n"
                  f"served:  {h.get('requests_served')} requests, {h.get('swaps')} swaps\n"
                  f"log:     {log or 'the terminal running `mlx-kit serve`'}", markup=False)


def stop(url: Optional[str] = URL) -> None:
    """Stop the mlx-kit server at the URL."""
    from kit.daemon import stop_server
    from kit.probe import probe
    from kit.urls import parse_url

    u = parse_url(url)
    if probe(u).kind == "other":
        raise ServerError(f"{u.root} is not an mlx-kit server; not stopping it")
    pid = stop_server(u)
    console.print(f"stopped the server at {u.root} (pid {pid})" if pid
                  else f"no mlx-kit server at {u.root}")
