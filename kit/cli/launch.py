"""``mlx-kit launch AGENT [-- agent args]``: reuse or start the server, configure, exec."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Optional

import typer

from kit.cli.config_options import takes_config
from kit.cli.console import err_console
from kit.cli.options import URL
from kit.cli.serve import check_startable
from kit.errors import AgentNotInstalledError, ConfigError

if TYPE_CHECKING:
    from kit.config import EngineConfig
    from kit.engine.status import DistributedStatus
    from kit.harness.spec import HarnessSpec
    from kit.harness.tools import AgentBinary


@takes_config("launch")
def launch(
    ctx: typer.Context,
    agent: str = typer.Argument(..., help="Agent to run, e.g. pi."),
    url: Optional[str] = URL,
    timeout: float = typer.Option(600.0, "--timeout", min=1,
                                  help="Seconds to wait for the server."),
    install: bool = typer.Option(False, "--install", help="If AGENT is missing, install "
                                 "it into mlx-kit's own tools folder without asking (also "
                                 "MLX_KIT_INSTALL=1); on a terminal launch asks, else it "
                                 "says how to install it."),
    *,
    config: EngineConfig,
) -> None:
    """Run AGENT against the local server; arguments after `--` go to the agent.

    It starts a server if none runs (or reuses it), configures AGENT for it and then
    becomes AGENT: its stdout is the agent's, so launch has no --json (use `mlx-kit status
    --json` for the server it used). Agents: see `mlx-kit harness list`. The server
    options apply to a server it starts (as `serve`'s); a running one keeps its own.
    """
    from kit.blas import missing_blas_note
    from kit.daemon import ensure_server
    from kit.engine.distributed.hosts import plan_world
    from kit.harness import install as hi
    from kit.harness.spec_loader import load_spec
    from kit.harness.tools import find_agent
    from kit.probe import probe as probe_url
    from kit.urls import parse_url

    spec = load_spec(agent)
    found = find_agent(spec)
    # checked here, as serve checks them, so bad flags fail before a server starts (and
    # before an agent is installed)
    c, model = config, config.model
    world = plan_world(c.ranks, c.hosts, c.hostfile, c.backend, c.pipeline, c.rank_timeout)
    check_startable(c, world)
    found = found or _install_missing(spec, install)
    binary = found.path
    serve_args = c.to_argv("launch", exclude=frozenset({"model"}))
    trust_remote_code, kv_bits = c.trust_remote_code, c.kv_bits
    u = parse_url(url)
    if not probe_url(u).ready and (note := missing_blas_note()):  # a server this starts
        err_console.print(f"note: {note}", markup=False)
    with err_console.status(f"connecting to {u.root}") as spinner:
        probe, started = ensure_server(u, model, timeout,
                                       on_wait=lambda line: spinner.update(f"server {line}"),
                                       serve_args=serve_args or None)
    health = probe.health
    assert health is not None  # ensure_server returns a ready server's probe
    if trust_remote_code and not started:
        # the flag is the server's: a server already running keeps what it was started with
        err_console.print("warning: --trust-remote-code applies to a server this command "
                          "starts; the running one keeps its own setting (`mlx-kit stop`, "
                          "then launch again with the flag, if a model needs it)")
    if not started and (differs := _world_differs(world, health.distributed)):
        err_console.print(f"warning: the running server keeps its layout ({differs}); the "
                          "--ranks/--hosts/--hostfile/--backend/--pipeline flags apply to a "
                          "server this command starts (`mlx-kit stop`, then launch again "
                          "with them)", markup=False)
    running_kv = health.kv_cache.bits if health.kv_cache else None
    if not started and kv_bits is not None and running_kv != kv_bits:
        err_console.print(f"warning: the running server keeps its KV cache "
                          f"({f'{running_kv} bits' if running_kv else 'full precision'}); "
                          "--kv-bits applies to a server this command starts (`mlx-kit "
                          "stop`, then launch again with it)", markup=False)
    local_model = health.model
    if model and not started and model != local_model:
        from kit.daemon import admin_swap

        with err_console.status(f"swapping the server to {model}"):
            result = admin_swap(u, model)
        local_model = result["model"]
    err_console.print(f"{'started' if started else 'reusing'} mlx-kit server {u.v1} "
                      f"(pid {health.pid}): local -> {local_model}")
    if started:
        err_console.print("the server keeps running in the background for the next launch; "
                          "`mlx-kit stop` ends it")
    from kit.key_guard import why_not_send_key
    from kit.probe import fetch_status

    key = config.secret("api_key")
    if key and (why := why_not_send_key(u, health.pid)):
        raise ConfigError(f"not sending your API key to {u.root}: {why}",
                          hint="`mlx-kit status` shows what runs there; stop whatever is not "
                               "yours, or pass --url of your own server")
    if fetch_status(u, key) == 401:
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
    os.execvpe(binary, argv, {**found.environ(os.environ), **extra_env})


def _install_missing(spec: HarnessSpec, flag: bool) -> AgentBinary:
    """Install a missing agent into mlx-kit's tools folder when ``--install`` /
    ``MLX_KIT_INSTALL=1`` say so or the user says yes on a terminal; else refuse, naming
    the commands that install it.

    Raises:
        AgentNotInstalledError: no registry package, not asked to install, or declined.
        HarnessError: the install failed.
    """
    from kit.cli.agent_cmds import install_copy
    from kit.harness.tools import AgentBinary, install_decision, tools_dir

    missing = f"{spec.binary} ({spec.description}) is not installed"
    if spec.package is None:
        raise AgentNotInstalledError(missing, hint=spec.install)
    assert spec.verified is not None  # a [package] needs verified
    what = f"{spec.package.name} {spec.verified[1]} ({spec.package.registry})"
    decision = install_decision(flag, os.environ,
                                sys.stdin.isatty() and sys.stderr.isatty())
    if decision == "ask" and not typer.confirm(
            f"{missing}. Install {what} into mlx-kit's tools folder ({tools_dir()})?",
            default=True, err=True):
        decision = "refuse"
    if decision == "refuse":
        raise AgentNotInstalledError(missing, hint=(
            f"`mlx-kit launch {spec.name} --install` installs {what} into mlx-kit's own "
            f"tools folder (or `mlx-kit harness install-agent {spec.name}`); by hand: "
            f"{spec.install}"))
    copy, _ = install_copy(spec)
    return AgentBinary(str(copy.binary), "tools", copy)


def _world_differs(world: Any, running: DistributedStatus | None) -> str | None:
    """How the running server's world (/health's ``distributed``, None for a single
    process) differs from the one the flags ask for (a ``WorldPlan`` or None), as the
    text of a warning; None when it is the same or no flag asked for one. Compared:
    world size, backend and mode (/health names each rank's host by its host name, the
    flags by address, so hosts are not compared)."""
    if world is None:
        return None
    if not running:
        return f"one process, not {world.size} {world.backend} ranks"
    have = (running.world_size, running.backend, running.mode)
    want = (world.size, world.backend, world.mode)
    if have == want or (not world.pipeline and have[:2] == want[:2]
                        and have[2] == "pipeline"):  # serve's fallback to a layer split
        return None
    return (f"{have[0]} {have[1]} ranks, {have[2]} parallel; asked for {want[0]} {want[1]} "
            f"ranks, {want[2]} parallel")
