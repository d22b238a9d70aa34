"""``mlx-kit harness install|remove|list``: configure agents for the server."""

from __future__ import annotations

from typing import Optional

import typer

from kit.cli.console import console
from kit.cli.options import URL

app = typer.Typer(help="Configure coding agents to use the mlx-kit server.", no_args_is_help=True)


@app.command("install")
def install(
    agent: str = typer.Argument(..., help="Agent name (see `mlx-kit harness list`)."),
    url: Optional[str] = URL,
    base_url: Optional[str] = typer.Option(None, "--base-url", help="Alias of --url."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (the diff on "
                                 "stdout; each file's action and why on stderr), write "
                                 "nothing."),
    force: bool = typer.Option(False, "--force", help="Overwrite a file mlx-kit did not write."),
) -> None:
    """Write the agent's provider config for the server (model id 'local')."""
    from kit.harness import install as hi
    from kit.harness.spec_loader import load_spec
    from kit.urls import parse_url

    spec = load_spec(agent)
    if dry_run:
        print_plan(hi.plan(spec, parse_url(base_url or url), force=force))
        return
    result = hi.install(spec, parse_url(base_url or url), force=force)
    if result.recovered is not None:
        print_removal(result.recovered, prefix="an earlier install the manifest did not "
                      "record: ")
    for ch in result.changes:
        verb = "wrote" if ch.path in result.written else "unchanged"
        console.print(f"{verb} {ch.path}", markup=False)
    console.print(f"models baked in from the {result.baked_source}", markup=False)


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
) -> None:
    """Remove exactly what mlx-kit wrote for the agent (or for all of them)."""
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
    for name in names:
        try:
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
            continue
        if print_removal(result, prefix=f"{name}: " if all_ else ""):
            changed_any = True
        elif not all_:
            console.print(f"nothing of mlx-kit's was installed for {name}")
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
) -> None:
    """Print what `harness install` would write for the agent (each file's full text)."""
    from kit.harness import install as hi
    from kit.harness.spec_loader import load_spec
    from kit.urls import parse_url

    for step in hi.plan(load_spec(agent), parse_url(url)).steps:
        if step.new is None:  # a shared file we cannot merge into: say why
            raise step.error(step.why, hint=step.hint)
        console.print(f"# {step.path}" + (" (merged into your file)" if step.merged
                                          else ""), markup=False)
        console.print(step.new, markup=False, end="" if step.new.endswith("\n") else "\n")


@app.command("status")
def status_(
    url: Optional[str] = typer.Option(
        None, "--url", envvar="MLX_KIT_URL", help="Also say which configured agents point "
        "elsewhere than this server (env MLX_KIT_URL)."),
) -> None:
    """Per agent: binary and version (flagged when newer than the newest version mlx-kit
    verified), configured?, drift since written, server reachable (each agent's own
    recorded URL is probed)."""
    from concurrent.futures import ThreadPoolExecutor

    from rich.table import Table

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
    table = Table("agent", "binary", "verified", "configured", "drift", "server")
    for column in table.columns:
        column.overflow = "fold"
    for spec in specs:
        st, v = states[spec.name], versions.get(spec.name)
        server = "-"
        if st.base_url:
            p = reachable[st.base_url]
            server = f"{st.base_url}: " + ("up" if p.ready else "down" if p.kind == "none"
                                           else p.kind)
            if here is not None and parse_url(st.base_url).root != here.root:
                server += f" (not {here.root})"
        verified = "-" if spec.verified is None else spec.verified[0] if \
            spec.verified[0] == spec.verified[1] else "-".join(spec.verified)
        if v is not None and v.newer:
            verified += f" (installed {v.version} is newer: untested)"
        binary = (v.line if v is not None and v.line else st.binary) if st.binary \
            else "not found"
        table.add_row(spec.name, binary, verified, "yes" if st.installed else "no",
                      ", ".join(map(str, st.drift)) or "-", server)
    console.print(table)


@app.command("list")
def list_() -> None:
    """Each known agent: configured? the API it speaks, where its config goes, binary
    found? Agents of the user's own (<config dir>/harnesses/*.toml) are listed too; a
    spec file of theirs that is refused is named with its problem (exit 1), the other
    agents still listed."""
    from rich.markup import escape
    from rich.table import Table

    from kit.cli.console import err_console
    from kit.harness import install as hi
    from kit.harness.spec import APIS
    from kit.harness.spec_loader import load_all

    agents = load_all()
    table = Table()
    for name in ("agent", "configured", "api", "config", "binary"):
        # the short columns stay whole (the API's route is one word); paths fold
        table.add_column(name, overflow="fold", no_wrap=name in ("agent", "api"))
    for spec in agents.specs.values():
        st = hi.status(spec)
        table.add_row(spec.name, "yes" if st.installed else "no", APIS[spec.api],
                      ", ".join(map(str, st.paths)),
                      st.binary or f"not found ({spec.install})")
    console.print(table)
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
