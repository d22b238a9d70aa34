"""``mlx-kit harness install-agent|upgrade``: agents installed into mlx-kit's own tools
folder (:mod:`kit.harness.agent_install`), and the install ``launch`` offers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from kit.cli.console import console, err_console
from kit.cli.output import JSON, emit_json

if TYPE_CHECKING:
    from kit.harness.spec import HarnessSpec
    from kit.harness.tools import ToolCopy


def install_copy(spec: HarnessSpec, version: str | None = None) -> tuple[ToolCopy, bool]:
    """Install ``spec``'s agent into the tools folder with a spinner on stderr (what it
    installs, from where, into which folder), then say where it went.

    Raises:
        HarnessError: no registry package, or the install failed.
    """
    from kit.harness.agent_install import install_agent

    with err_console.status(f"installing {spec.name}") as spinner:
        copy, fresh = install_agent(spec, version, progress=lambda line: spinner.update(line))
    verb = "installed" if fresh else "already installed:"
    err_console.print(f"{verb} {spec.name} {copy.version} in {copy.root} (mlx-kit's tools "
                      "folder; `mlx-kit harness status` shows which copy runs)", markup=False)
    return copy, fresh


def register(app: typer.Typer) -> None:
    """Add ``install-agent`` and ``upgrade`` to the ``harness`` command group."""
    app.command("install-agent")(install_agent_cmd)
    app.command("upgrade")(upgrade_cmd)


def install_agent_cmd(
    agent: str = typer.Argument(..., help="Agent name (see `mlx-kit harness list`)."),
    version: Optional[str] = typer.Option(None, "--version", help="The package version "
                                          "(default: the newest mlx-kit verified)."),
    as_json: bool = JSON,
) -> None:
    """Install AGENT from its registry (npm or PyPI) into mlx-kit's own tools folder, never
    globally; it then runs on `mlx-kit launch` before any copy on PATH. npm agents get a
    Node from PyPI when the system's is missing or too old. Agents with no registry
    package (Goose, Zed, Crush) print their official install command (exit 1).

    \b
    --json: {"agent", "version", "path": the copy's folder, "binary", "installed": false
    when that version was there already}.
    """
    from kit.harness.spec_loader import load_spec

    spec = load_spec(agent)
    copy, fresh = install_copy(spec, version)
    if spec.verified and copy.version not in spec.verified and \
            not _between(copy.version, spec.verified):
        err_console.print(f"note: {spec.name} {copy.version} is outside the versions mlx-kit "
                          f"verified ({'-'.join(spec.verified)})", markup=False)
    if as_json:
        emit_json({"agent": spec.name, "version": copy.version, "path": str(copy.root),
                   "binary": str(copy.binary), "installed": fresh})
        return
    console.print(str(copy.binary), markup=False)


def _between(version: str, verified: tuple[str, str]) -> bool:
    from kit.harness.versions import version_key

    return version_key(verified[0]) <= version_key(version) <= version_key(verified[1])


def upgrade_cmd(
    agent: Optional[str] = typer.Argument(None, help="Agent name (default: every agent "
                                          "in mlx-kit's tools folder)."),
    as_json: bool = JSON,
) -> None:
    """Bring agents in mlx-kit's tools folder to the newest version mlx-kit verified
    (an agent named that is not there yet is installed). Copies on PATH are the user's own
    and are left alone.

    \b
    --json: {"agents": [{"agent", "from": the version before or null, "to", "path"}]}.
    """
    from kit.harness.spec_loader import all_specs, load_spec
    from kit.harness.tools import current_copy

    if agent:
        specs = [load_spec(agent)]
    else:
        specs = [s for s in all_specs().values() if current_copy(s) is not None]
    report = []
    for spec in specs:
        before = current_copy(spec)
        copy, _ = install_copy(spec)
        report.append({"agent": spec.name, "from": before.version if before else None,
                       "to": copy.version, "path": str(copy.root)})
    if as_json:
        emit_json({"agents": report})
        return
    if not specs:
        console.print("no agent is installed in mlx-kit's tools folder (`mlx-kit harness "
                      "install-agent AGENT`)", markup=False)
    for r in report:
        change = f"{r['from']} -> {r['to']}" if r["from"] and r["from"] != r["to"] \
            else f"{r['to']} (up to date)" if r["from"] else f"{r['to']} (new)"
        console.print(f"{r['agent']}: {change}", markup=False)
