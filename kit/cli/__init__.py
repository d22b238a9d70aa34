"""The ``mlx-kit`` command line (typer). One module per command group.

Expected errors (:class:`kit.errors.KitError`) print one line + a hint and exit 1; Ctrl-C
exits 130; anything else is unexpected: a short message + the path of a log with the
traceback.
"""

from __future__ import annotations

import sys
import tempfile
import traceback

import typer

from kit import __version__
from kit.cli import harness, launch, logs_cmd, models_cmds, serve, server_cmds
from kit.cli.console import err_console
from kit.errors import KitError

app = typer.Typer(
    name="mlx-kit",
    help="Run a local MLX model server and wire coding agents to it (stable model id 'local').",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve")(serve.serve)
app.command("launch", context_settings={"allow_extra_args": True,
                                        "ignore_unknown_options": True})(launch.launch)
app.command("status")(server_cmds.status)
app.command("stop")(server_cmds.stop)
app.command("logs")(logs_cmd.logs)
app.command("models")(models_cmds.models)
app.command("swap")(models_cmds.swap)
app.command("fit")(models_cmds.fit)
app.command("pull")(models_cmds.pull)
app.add_typer(harness.app, name="harness")


def _version(value: bool) -> None:
    if value:
        print(f"mlx-kit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """mlx-kit: a local MLX LLM server for coding agents."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``mlx-kit`` console script.

    Usage errors, ``--help`` and Ctrl-C are handled by typer/click's standalone mode (usage
    message, exit 2; "Aborted!", exit 1); our expected errors print one line + hint."""
    from rich.markup import escape  # messages name keys like [vars] and files[0]: text

    try:
        app(args=argv, prog_name="mlx-kit")
    except KitError as e:
        err_console.print(f"[bold red]error:[/] {escape(e.message)}", highlight=False)
        if e.hint:
            err_console.print(f"[bold]hint:[/] {escape(e.hint)}", highlight=False)
        sys.exit(1)
    except Exception as e:
        from kit.paths import log_dir

        with tempfile.NamedTemporaryFile("w", prefix="crash-", suffix=".log", delete=False,
                                         dir=log_dir(create=True)) as f:
            traceback.print_exc(file=f)
        err_console.print(f"[bold red]unexpected error:[/] {type(e).__name__}: "
                          f"{escape(str(e))}\ndetails: {escape(f.name)}", highlight=False)
        sys.exit(1)
