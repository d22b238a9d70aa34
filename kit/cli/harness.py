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
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff, write nothing."),
    force: bool = typer.Option(False, "--force", help="Overwrite a file mlx-kit did not write."),
) -> None:
    """Write the agent's provider config for the server (model id 'local')."""
    from kit.harness import install as hi
    from kit.harness.spec import load_spec
    from kit.urls import parse_url

    spec = load_spec(agent)
    result = hi.install(spec, parse_url(base_url or url), dry_run=dry_run, force=force)
    if dry_run:
        diffs = [c.diff() for c in result.changes if c.changed]
        console.print("".join(diffs) if diffs else "no changes\n", markup=False, end="")
        return
    for ch in result.changes:
        verb = "wrote" if ch.path in result.written else "unchanged"
        console.print(f"{verb} {ch.path}", markup=False)
    console.print(f"models baked in from the {result.baked_source}", markup=False)


@app.command("remove")
def remove(
    agent: str = typer.Argument(..., help="Agent name."),
    force: bool = typer.Option(False, "--force", help="Remove even if edited since written."),
) -> None:
    """Remove exactly what mlx-kit wrote for the agent."""
    from kit.harness import install as hi
    from kit.harness.spec import load_spec

    result = hi.remove(load_spec(agent), force=force)
    for p in result.removed:
        console.print(f"removed {p}", markup=False)
    for p in result.restored:
        console.print(f"restored your own {p} (saved when install was forced)", markup=False)
    for p in result.unmerged:
        console.print(f"removed mlx-kit's entries from {p}", markup=False)
    if not (result.removed or result.restored or result.unmerged):
        console.print(f"nothing of mlx-kit's was installed for {agent}")


@app.command("list")
def list_() -> None:
    """Each known agent: configured? where? binary found?"""
    from rich.table import Table

    from kit.harness import install as hi
    from kit.harness.spec import all_specs

    table = Table("agent", "configured", "config", "binary")
    for column in table.columns:
        column.overflow = "fold"
    for spec in all_specs().values():
        st = hi.status(spec)
        table.add_row(spec.name, "yes" if st.installed else "no",
                      ", ".join(map(str, st.paths)),
                      st.binary or f"not found ({spec.install})")
    console.print(table)
