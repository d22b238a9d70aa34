"""``mlx-kit status`` and ``mlx-kit stop``."""

from __future__ import annotations

from typing import Optional

import typer

from kit.cli.console import console, err_console
from kit.cli.options import URL
from kit.errors import PortInUseError

#: `status` exit codes (listed in its --help and docs/server.md): 3 "not running" and
#: 1 "dead" as in the LSB/systemctl convention
EXIT_OK, EXIT_FAILED, EXIT_NO_SERVER, EXIT_NOT_READY = 0, 1, 3, 4


def status(url: Optional[str] = URL) -> None:
    """Show whether an mlx-kit server answers, its pid and the model behind 'local'.

    \b
    Exit codes:
      0  ok: the server answers and its model is loaded (or unloaded after --ttl)
      1  failed: the model failed to load or the engine kept dying
         (the reason and the fix are printed), or it is not mlx-kit
      3  no server answers at the URL
      4  not ready yet: loading, restarting an engine that died, or stopping
    """
    from kit.daemon import log_file, read_pid_file
    from kit.probe import probe
    from kit.urls import parse_url

    u = parse_url(url)
    p = probe(u)
    if p.kind == "none":
        console.print(f"no server at {u.root}")
        raise typer.Exit(EXIT_NO_SERVER)
    if p.kind == "other":
        raise PortInUseError(f"{u.root} answers but is not mlx-kit ({p.detail})")
    h = p.health or {}
    info = read_pid_file(u) or {}
    log = info.get("log") if info.get("pid") == h.get("pid") else None
    console.print(f"url:     {u.v1}\nstatus:  {h.get('status')} (model {h.get('model_state')})"
                  f"\npid:     {h.get('pid')} (engine {h.get('engine_pid')})\n"
                  f"local -> {h.get('model')} (context window {h.get('context_window')})\n"
                  f"served:  {h.get('requests_served')} requests, {h.get('swaps')} swaps, "
                  f"{h.get('restarts')} engine restarts\n"
                  f"log:     {log or 'the terminal running `mlx-kit serve`'}", markup=False)
    if isinstance(h.get("distributed"), dict):
        console.print(_world_lines(h["distributed"]), markup=False)
    if p.ready:
        return
    where = f"; log: {log}" if log else (f"; log: {log_file(u)}" if info else "")
    if h.get("status") != "failed":  # loading, restarting, stopped (shutting down)
        reason = h.get("error") or ("the server is shutting down" if h.get("status") ==
                                    "stopped" else "the model is loading")
        err_console.print(f"not ready yet: {reason}", markup=False)
        raise typer.Exit(EXIT_NOT_READY)
    err_console.print(f"error: {h.get('error') or 'the server is ' + str(h.get('status'))}\n"
                      "hint: `mlx-kit swap MODEL` to a model that loads, or `mlx-kit stop` "
                      f"and start it again (the next request also retries){where}",
                      markup=False)
    raise typer.Exit(EXIT_FAILED)


def _world_lines(world: dict) -> str:
    """``status``'s lines for /health's ``distributed``: the world, then one line per rank
    (its host and pid; memory too once the rank reported it)."""
    lines = [f"world:   {world.get('world_size')} ranks ({world.get('backend')}, "
             f"{world.get('mode')} parallel)"]
    for r in world.get("ranks") or []:
        memory = r.get("memory") or {}
        weights = memory.get("weights_bytes")
        name = r.get("hostname")
        lines.append(f"  rank {r.get('rank')}: {r.get('host')} (pid {r.get('pid')})"
                     + (f", {name}" if name and name != r.get("host") else "")
                     + (f", weights {weights / 2**20:.0f} MiB" if weights else ""))
    return "\n".join(lines)


def stop(url: Optional[str] = URL) -> None:
    """Stop the mlx-kit server at the URL, if this user started it on this machine.

    It is signalled only when this user's pid file, the process's start time
    and command line, and /health all name the same process on a loopback URL;
    otherwise it is asked through the admin API (the token in the pid file),
    or left alone with the reason (exit 1)."""
    from kit.daemon import stop_server
    from kit.urls import parse_url

    u = parse_url(url)
    stopped = stop_server(u)
    if stopped is None:
        console.print(f"no mlx-kit server at {u.root}")
        return
    pid, how = stopped
    console.print(f"stopped the server at {u.root} (pid {pid}, via {how})", markup=False)
