"""``mlx-kit status`` and ``mlx-kit stop``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from kit.cli.console import console, err_console
from kit.cli.options import URL
from kit.cli.output import JSON, emit_json
from kit.errors import ExitCode, PortInUseError, ServerError

if TYPE_CHECKING:
    from kit.engine.status import DistributedStatus
    from kit.health import HealthBody

#: `status` exit codes (listed in its --help and docs/server.md), from the one table
#: kit.errors.ExitCode: 3 "not running" and 1 "dead" as in the LSB/systemctl convention
EXIT_OK, EXIT_FAILED = ExitCode.OK, ExitCode.ERROR
EXIT_NO_SERVER, EXIT_NOT_READY = ExitCode.NO_SERVER, ExitCode.NOT_READY


def status(url: Optional[str] = URL, as_json: bool = JSON) -> None:
    """Show whether an mlx-kit server answers, its pid and the model behind 'local'.

    \b
    Exit codes:
      0  ok: the server answers and its model is loaded (or unloaded after --ttl)
      1  failed: the model failed to load or the engine kept dying
         (the reason and the fix are printed), or it is not mlx-kit
      3  no server answers at the URL
      4  not ready yet: loading, restarting an engine that died, or stopping
      5  failed: the model does not fit in memory (the numbers are printed)

    \b
    --json prints /health's body (same keys) plus "url", "log", "running"
    and "health_error" (/health's "error": the reason, or null); "error"
    is null, or when it exits 1 or 5 the error object every --json error
    is ({"message", "hint", "exit_code", "type"}); with no server:
    {"url": ..., "running": false}.
    """
    from kit.daemon import log_file, read_pid_file
    from kit.probe import probe
    from kit.urls import parse_url

    u = parse_url(url)
    p = probe(u)
    if p.kind == "none":
        if as_json:
            emit_json({"url": u.v1, "running": False})
        else:
            console.print(f"no mlx-kit server is running on {u.root}", markup=False)
            err_console.print("hint: start one with `mlx-kit serve` (or `mlx-kit launch "
                              "AGENT`), or pass --url", markup=False)
        raise typer.Exit(EXIT_NO_SERVER)
    if p.kind == "other":
        raise PortInUseError(f"{u.root} answers but is not mlx-kit ({p.detail})")
    h = p.health
    assert h is not None  # "ours" always carries its parsed body
    info = read_pid_file(u) or {}
    log = info.get("log") if info.get("pid") == h.pid else None
    where = f"; log: {log}" if log else (f"; log: {log_file(u)}" if info else "")
    failed = _failure(h, where) if not p.ready and h.status == "failed" else None
    if as_json:
        # "error" is the CLI's error object (docs/cli.md) or null; /health's own string
        # (the reason, also while not ready) is under "health_error"
        emit_json({**h.to_json(), "health_error": h.error, "url": u.v1, "log": log,
                   "running": True, **(failed or {"error": None})})
        if p.ready:
            return
        raise typer.Exit(failed["error"]["exit_code"] if failed else EXIT_NOT_READY)
    phase = f", {h.phase}" if h.phase else ""  # issue 16's load phase, if any
    console.print(f"url:     {u.v1}\nstatus:  {h.status} (model {h.model_state}{phase})\n"
                  f"pid:     {h.pid} (engine {h.engine_pid})\n"
                  f"local -> {h.model} (context window {h.context_window})\n"
                  f"served:  {h.requests_served} requests, {h.swaps} swaps, "
                  f"{h.restarts} engine restarts\n"
                  f"log:     {log or 'the terminal running `mlx-kit serve`'}", markup=False)
    if h.distributed is not None:
        console.print(_world_lines(h.distributed), markup=False)
    if p.ready:
        return
    if failed is None:  # loading, restarting, stopped (shutting down)
        reason = h.error or ("the server is shutting down" if h.status == "stopped"
                             else "the model is loading")
        err_console.print(f"not ready yet: {reason}", markup=False)
        raise typer.Exit(EXIT_NOT_READY)
    err = failed["error"]
    err_console.print(f"error: {err['message']}\nhint: {err['hint']}", markup=False)
    raise typer.Exit(err["exit_code"])


def _failure(h: HealthBody, where: str) -> dict:
    """The error of a server whose /health says ``failed``, as ``--json`` prints errors
    (:func:`kit.cli.output.error_json`): its exit code and type from /health's
    ``error_type`` (5 and ModelDoesNotFitError for ``model_does_not_fit``, else 1)."""
    from kit.cli.output import error_json
    from kit.errors import error_class_of_kind

    cls = error_class_of_kind(h.error_type) or ServerError
    return error_json(h.error or f"the server is {h.status}",
                      "`mlx-kit swap MODEL` to a model that loads (or fits), or `mlx-kit "
                      f"stop` and start it again (the next request also retries){where}",
                      cls.exit_code, cls.__name__)


def _world_lines(world: DistributedStatus) -> str:
    """``status``'s lines for /health's ``distributed``: the world, then one line per rank
    (its host and pid; memory too once the rank reported it)."""
    lines = [f"world:   {world.world_size} ranks ({world.backend}, {world.mode} parallel)"]
    for r in world.ranks:
        weights = r.memory.weights_bytes if r.memory else None
        name = r.hostname
        lines.append(f"  rank {r.rank}: {r.host} (pid {r.pid})"
                     + (f", {name}" if name and name != r.host else "")
                     + (f", weights {weights / 2**20:.0f} MiB" if weights else ""))
    return "\n".join(lines)


def stop(url: Optional[str] = URL, as_json: bool = JSON) -> None:
    """Stop the mlx-kit server at the URL, if this user started it on this machine.

    It is signalled only when this user's pid file, the process's start time
    and command line, and /health all name the same process on a loopback URL;
    otherwise it is asked through the admin API (the token in the pid file),
    or left alone with the reason (exit 1). No server there is not an error (exit 0).

    \b
    --json: {"url", "stopped": true|false, "pid", "via": "signal"|"admin API"|null}.
    """
    import psutil

    from kit.daemon import stop_server
    from kit.urls import parse_url

    u = parse_url(url)
    try:
        stopped = stop_server(u)
    except psutil.AccessDenied as e:  # a server of another user, named by a pid file here
        raise ServerError(f"not stopping the server at {u.root}: {_owner(e.pid)} owns it, "
                          "and this user may not signal it",
                          hint="stop it as that user (or with sudo), or from the session "
                               "that started it") from None
    pid, how = stopped if stopped is not None else (None, None)
    if as_json:
        emit_json({"url": u.v1, "stopped": stopped is not None, "pid": pid, "via": how})
    elif stopped is None:
        console.print(f"no mlx-kit server at {u.root}")
    else:
        console.print(f"stopped the server at {u.root} (pid {pid}, via {how})", markup=False)


def _owner(pid: int | None) -> str:
    """``"user NAME (pid N)"`` for a process, as far as the system tells."""
    import psutil

    try:
        name = psutil.Process(pid).username() if pid else None
    except psutil.Error:
        name = None
    return f"user {name or '(unknown)'} (pid {pid if pid else '?'})"
