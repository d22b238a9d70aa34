"""``mlx-kit harness install|remove|list``: configure agents for the server."""

from __future__ import annotations

from typing import Optional

import typer

from kit.cli import agent_cmds
from kit.cli.console import console
from kit.cli.options import URL
from kit.cli.output import JSON, emit_json, print_table
from kit.urls import URL_ENV

app = typer.Typer(help="Configure coding agents to use the mlx-kit server, and install them "
                  "into mlx-kit's own tools folder.", no_args_is_help=True)


@app.command("install")
def install(
    agent: str = typer.Argument(..., help="Agent name (see `mlx-kit harness list`)."),
    url: Optional[str] = URL,
    base_url: Optional[str] = typer.Option(None, "--base-url", help="Alias of --url."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (the diff on "
                                 "stdout; each file's action and why on stderr), write "
                                 "nothing."),
    force: bool = typer.Option(False, "--force", help="Overwrite a file mlx-kit did not write."),
    as_json: bool = JSON,
) -> None:
    """Write the agent's provider config for the server (model id 'local').

    \b
    --json: {"agent", "url", "files": [{"path", "action": "wrote"|"unchanged"}],
    "baked_source", "recovered": a removal (as `harness remove --json`) or null};
    with --dry-run: {"agent", "dry_run": true, "diff", "steps": [{"path", "action",
    "why", "hint"}], "notes"}.
    """
    from kit.harness import install as hi
    from kit.harness.spec_loader import load_spec
    from kit.urls import parse_url

    spec = load_spec(agent)
    u = parse_url(base_url or url)
    if dry_run:
        plan = hi.plan(spec, u, force=force)
        if as_json:  # a refusal is the one JSON document: the error (as the real run's)
            for step in plan.refusals():
                raise step.error(step.why, hint=step.hint)
            emit_json(plan_json(plan))
            return
        print_plan(plan)
        return
    result = hi.install(spec, u, force=force)
    if as_json:
        emit_json({"agent": spec.name, "url": u.v1, "files": [
            {"path": str(ch.path), "action": "wrote" if ch.path in result.written
             else "unchanged"} for ch in result.changes],
            "baked_source": result.baked_source,
            "recovered": None if result.recovered is None
            else removal_json(result.recovered)})
        return
    if result.recovered is not None:
        print_removal(result.recovered, prefix="an earlier install the manifest did not "
                      "record: ")
    if not spec.files:  # an agent configured only through the environment (Copilot CLI)
        console.print(f"{spec.name} has no config file for mlx-kit to write: "
                      f"`mlx-kit launch {spec.name}` sets its environment", markup=False)
        return
    for ch in result.changes:
        verb = "wrote" if ch.path in result.written else "unchanged"
        console.print(f"{verb} {ch.path}", markup=False)
    console.print(f"models baked in from the {result.baked_source}", markup=False)


def plan_json(plan) -> dict:
    """A plan (``kit.harness.plan_types.Plan``) as ``--dry-run --json`` prints it."""
    steps = [s for s in plan.steps if s.old is not None or s.new is not None
             or s.action != "leave-alone"]
    return {"agent": plan.agent, "dry_run": True, "diff": plan.diff(),
            "steps": [{"path": str(s.path), "action": s.action, "why": s.why,
                       "hint": s.hint} for s in steps], "notes": plan.notes()}


def removal_json(result) -> dict:
    """A removal (``kit.harness.apply.Removal``) as ``--json`` prints it: the paths it
    removed, restored from mlx-kit's backup and took our entries out of, and what it
    left and why."""
    return {"removed": [str(p) for p in result.removed],
            "restored": [str(p) for p in result.restored],
            "unmerged": [str(p) for p in result.unmerged], "notes": list(result.notes),
            "changed": bool(result.removed or result.restored or result.unmerged)}


def print_plan(plan, prefix: str = "") -> None:
    """Print a plan (``kit.harness.plan_types.Plan``) as ``--dry-run`` shows it: the
    unified diff of every file it changes on stdout (usable as a patch), one line per file
    on stderr (``<action> <path>: <why>``) and what it leaves, and why.

    Raises:
        HarnessError: the plan refuses a step (the real run would refuse it too).
    """
    from kit.cli.console import err_console

    diff = plan.diff()
    if diff or not prefix:
        console.print(diff or "no changes\n", markup=False, end="")
    for line in plan.describe():
        err_console.print(f"{prefix}{line}", markup=False)
    for step in plan.refusals():
        raise step.error(step.why, hint=step.hint)


@app.command("remove")
def remove(
    agent: Optional[str] = typer.Argument(None, help="Agent name."),
    all_: bool = typer.Option(False, "--all", help="Remove every agent mlx-kit configured."),
    force: bool = typer.Option(False, "--force", help="Remove even if edited since written."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (the diff on "
                                 "stdout; each file's action and why on stderr), change "
                                 "nothing."),
    as_json: bool = JSON,
) -> None:
    """Remove exactly what mlx-kit wrote for the agent (or for all of them).

    \b
    --json: {"agents": {NAME: {"removed", "restored", "unmerged", "notes",
    "changed"} or {"error": {"message", "hint"}}}} (with --dry-run, each agent's
    plan as `harness install --dry-run --json` prints it); exit 1 if any was refused.
    """
    from rich.markup import escape

    from kit.cli.console import err_console
    from kit.errors import ConfigError, KitError
    from kit.harness import install as hi
    from kit.harness.spec_loader import load_spec

    if bool(agent) == all_:
        raise ConfigError("name one agent, or pass --all")
    from kit.harness.spec_loader import all_specs

    # --all checks every known agent, not only those the manifest lists: a deleted, stale
    # or moved-aside manifest must not hide an install that markers and receipts prove.
    names = sorted(set(all_specs()) | set(hi.installed_agents())) if all_ else [agent]
    refused: list[str] = []
    changed_any = False
    report: dict[str, dict] = {}
    for name in names:
        try:
            if dry_run and as_json:
                plan = hi.plan_removal(load_spec(name), force=force)
                report[name] = plan_json(plan)
                for step in plan.refusals():
                    raise step.error(step.why, hint=step.hint)
                continue
            if dry_run:
                print_plan(hi.plan_removal(load_spec(name), force=force),
                           prefix=f"{name}: " if all_ else "")
                continue
            result = hi.remove(load_spec(name), force=force)
        except KitError as e:
            if not all_:
                raise
            err_console.print(f"[bold red]error:[/] {name}: {escape(e.message)}",
                              highlight=False)
            refused.append(name)  # --all: the other agents still get removed
            report[name] = {"error": {"message": e.message, "hint": e.hint}}
            continue
        if as_json:
            report[name] = removal_json(result)
            continue
        if print_removal(result, prefix=f"{name}: " if all_ else ""):
            changed_any = True
        elif not all_:
            console.print(f"nothing of mlx-kit's was installed for {name}")
    if as_json:
        emit_json({"agents": report})
        if refused:  # the JSON above says which and why; no second document
            raise typer.Exit(1)
        return
    if all_ and not changed_any and not refused and not dry_run:
        console.print("nothing of mlx-kit's is installed for any agent")
    if refused:
        raise ConfigError(f"not removed: {', '.join(refused)} (see above)",
                          hint="pass --force to remove edited entries anyway")


def print_removal(result, prefix: str = "") -> bool:
    """Say what a removal (``kit.harness.apply.Removal``) did, one line per file, and
    what it left and why. Returns whether it changed anything."""
    for p in result.removed:
        console.print(f"{prefix}removed {p}", markup=False)
    for p in result.restored:
        console.print(f"{prefix}restored your own {p} from mlx-kit's backup", markup=False)
    for p in result.unmerged:
        console.print(f"{prefix}removed mlx-kit's entries from {p}", markup=False)
    changed = bool(result.removed or result.restored or result.unmerged)
    for note in result.notes:  # what it left, and why
        console.print(f"{prefix}{note}", markup=False)
    return changed


@app.command("show")
def show(
    agent: str = typer.Argument(..., help="Agent name."),
    url: Optional[str] = URL,
    as_json: bool = JSON,
) -> None:
    """Print what `harness install` would write for the agent (each file's full text).

    \b
    --json: {"agent", "files": [{"path", "merged", "text"}]}.
    """
    from kit.harness import install as hi
    from kit.harness.spec_loader import load_spec
    from kit.urls import parse_url

    steps = hi.plan(load_spec(agent), parse_url(url)).steps
    for step in steps:
        if step.new is None:  # a shared file we cannot merge into: say why
            raise step.error(step.why, hint=step.hint)
    if as_json:
        emit_json({"agent": agent, "files": [{"path": str(s.path), "merged": s.merged,
                                              "text": s.new} for s in steps]})
        return
    for step in steps:
        console.print(f"# {step.path}" + (" (merged into your file)" if step.merged
                                          else ""), markup=False)
        console.print(step.new, markup=False, end="" if step.new.endswith("\n") else "\n")


@app.command("status")
def status_(
    url: Optional[str] = typer.Option(
        None, "--url", envvar=URL_ENV, help="Also say which configured agents point "
        "elsewhere than this server."),
    as_json: bool = JSON,
) -> None:
    """Per agent: its version (flagged when newer than the newest version mlx-kit
    verified), configured? (and edited since written: the files are listed below), the
    server its config points at (each recorded URL is probed: up, down, other), which
    copy runs (mlx-kit's tools folder's, else one on PATH).

    \b
    --json: {"agents": [{"name", "binary", "source": "tools"|"path"|null, "version", "version_line", "verified":
    [oldest, newest] or null, "newer", "installed", "drift": [paths], "base_url",
    "server": null or {"kind": "ours"|"other"|"none", "status": /health's status,
    "model", "elsewhere": points at another server than --url}}]}.
    """
    from concurrent.futures import ThreadPoolExecutor

    from kit.harness import install as hi
    from kit.harness.spec_loader import all_specs
    from kit.harness.versions import probe_versions
    from kit.probe import probe
    from kit.urls import parse_url

    here = parse_url(url) if url else None
    specs = list(all_specs().values())
    states = {spec.name: hi.status(spec) for spec in specs}
    # Version probes (agent start-up: up to ~2.5 s each) and URL probes, all at once; each
    # distinct URL is probed once.
    urls = sorted({st.base_url for st in states.values() if st.base_url})
    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        url_probes = {u: pool.submit(probe, parse_url(u), timeout=1.0) for u in urls}
        versions = probe_versions([(s, states[s.name].binary) for s in specs
                                   if states[s.name].binary])
        reachable = {u: f.result() for u, f in url_probes.items()}
    if as_json:
        emit_json({"agents": [_status_json(spec, states[spec.name], versions.get(spec.name),
                                           reachable, here) for spec in specs]})
        return
    rows, notes = [], []
    for spec in specs:
        st, v = states[spec.name], versions.get(spec.name)
        server = "-"
        if st.base_url:
            p = reachable[st.base_url]
            server = parse_url(st.base_url).root.split("://", 1)[1] + " " + (
                "up" if p.ready else "down" if p.kind == "none" else p.kind)
            if here is not None and parse_url(st.base_url).root != here.root:
                server += " (elsewhere)"
        verified = "-" if spec.verified is None else spec.verified[0] if \
            spec.verified[0] == spec.verified[1] else "-".join(spec.verified)
        if v is not None and v.newer:
            verified += " (newer: untested)"
        version = "not found" if not st.binary else \
            (v.version or v.line or "?") if v is not None else "?"
        state = configured(spec, st.installed)
        if st.drift:
            state += ", edited"
            notes.append(f"{spec.name}: edited since mlx-kit wrote it (launch keeps your "
                         f"edits): {', '.join(map(str, st.drift))}")
        runs = {"tools": "mlx-kit", "path": "PATH"}.get(st.binary_source or "", "-")
        rows.append((spec.name, version, verified, state, server, runs))
    # Cells stay short so the table fits 80 columns; paths go below it, the rest in --json.
    print_table(("agent", "version", "verified", "configured", "server", "runs"), rows)
    console.print()
    for note in notes:
        console.print(note, markup=False)
    console.print("runs: mlx-kit = in mlx-kit's tools folder, PATH = your own install\n"
                  "binaries' paths and the servers' URLs: --json", markup=False)


def configured(spec, installed: bool) -> str:
    """The "configured" cell of `harness list` / `status`: yes, no, or "-" for an agent
    whose spec writes no file (launch sets its environment, there is nothing to install)."""
    return "-" if not spec.files else "yes" if installed else "no"


def _status_json(spec, st, v, reachable: dict, here) -> dict:
    """One agent of ``harness status --json`` (``st``: its AgentStatus, ``v``: its
    AgentVersion or None, ``reachable``: probe per recorded URL, ``here``: --url)."""
    from kit.urls import parse_url

    server = None
    if st.base_url:
        p = reachable[st.base_url]
        health = p.health
        server = {"kind": p.kind, "status": health.status if health else None,
                  "model": health.model if health else None,
                  "elsewhere": here is not None and parse_url(st.base_url).root != here.root}
    return {"name": spec.name, "binary": st.binary, "source": st.binary_source,
            "version": v.version if v is not None else None,
            "version_line": v.line if v is not None else None,
            "verified": list(spec.verified) if spec.verified is not None else None,
            "newer": bool(v is not None and v.newer), "installed": st.installed,
            "drift": [str(p) for p in st.drift], "base_url": st.base_url, "server": server}


@app.command("list")
def list_(as_json: bool = JSON) -> None:
    """Each known agent: configured? the API it speaks, which binary (mlx-kit's copy, one
    on PATH, or missing: then how to install it). Agents of the user's own (<config dir>/harnesses/*.toml) are listed too; a
    spec file of theirs that is refused is named with its problem (exit 1), the other
    agents still listed.

    \b
    --json: {"agents": [{"name", "installed", "api", "paths", "binary", "install",
    "builtin"}], "problems": [{"message", "hint"}]}.
    """
    from rich.markup import escape

    from kit.cli.console import err_console
    from kit.harness import install as hi
    from kit.harness.spec import APIS
    from kit.harness.spec_loader import load_all

    agents = load_all()
    states = {name: hi.status(spec) for name, spec in agents.specs.items()}
    if as_json:
        emit_json({"agents": [
            {"name": spec.name, "installed": states[name].installed, "api": APIS[spec.api],
             "paths": [str(p) for p in states[name].paths], "binary": states[name].binary,
             "install": spec.install, "builtin": spec.builtin}
            for name, spec in agents.specs.items()],
            "problems": [{"message": p.message, "hint": p.hint}
                         for p in agents.problems.values()]})
        if agents.problems:
            raise typer.Exit(1)
        return
    # Cells stay short so the table fits 80 columns: config paths are `harness show`'s,
    # binaries `harness status`'s, and every one of them is in --json.
    rows, missing = [], []
    for name, spec in agents.specs.items():
        st = states[name]
        rows.append((spec.name, configured(spec, st.installed), APIS[spec.api],
                     {"tools": "mlx-kit", "path": "PATH"}.get(st.binary_source or "", "missing")))
        if not st.binary:
            missing.append(spec)
    print_table(("agent", "configured", "api", "binary"), rows)
    console.print("\nconfig files: mlx-kit harness show AGENT; every path: --json\n"
                  "binary: mlx-kit = in mlx-kit's tools folder, PATH = your own install",
                  markup=False)
    if missing:
        console.print("to install a missing agent:", markup=False)
        width = max(len(s.name) for s in missing)
        for spec in missing:
            console.print(f"  {spec.name.ljust(width)}  {spec.install_hint}", markup=False)
    user = [s for s in agents.specs.values() if not s.builtin]
    if user:
        console.print(f"your own agents ({user[0].source.parent}): "
                      + ", ".join(s.name for s in user), markup=False)
    for problem in agents.problems.values():
        err_console.print(f"[bold red]error:[/] {escape(problem.message)}", highlight=False)
        if problem.hint:
            err_console.print(f"[bold]hint:[/] {escape(problem.hint)}", highlight=False)
    if agents.problems:
        raise typer.Exit(1)


agent_cmds.register(app)  # install-agent, upgrade
