"""The ``mlx-kit`` command line (typer). One module per command group.

Exit codes come from one table, :class:`kit.errors.ExitCode`, applied here in :func:`main`:
expected errors (:class:`kit.errors.KitError`) print one line + a hint and exit with the
error's ``exit_code``; click's usage errors exit 2; Ctrl-C exits 130; anything else is
unexpected: a short message + the path of a log with the traceback, exit 70. With
``--json`` an error is also printed as one JSON object on stdout.

Help is click's plain formatter (``rich_markup_mode=None``): typer 0.29's rich help panel
prints every boolean flag as taking a value (``--json <bool>``; it calls
``display_type_rich`` without the ``is_flag`` check its plain formatter has), and plain
help is what docs/cli.md is generated from.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback

import typer

from kit import __version__
from kit.cli import doctor, harness, launch, logs_cmd, models_cmds, serve, server_cmds
from kit.cli.console import err_console
from kit.errors import EXIT_CODE_MEANINGS, ExitCode, KitError


def _exit_code_epilog() -> str:
    rows = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODE_MEANINGS)
    return "\b\nExit codes (every command):\n" + rows


app = typer.Typer(
    name="mlx-kit",
    help="Run a local MLX model server and wire coding agents to it (stable model id 'local').",
    epilog=_exit_code_epilog(),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
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
app.command("doctor")(doctor.doctor)
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
    """Entry point of the ``mlx-kit`` console script: runs the command and exits with the
    code of :class:`kit.errors.ExitCode` its outcome maps to (the one place that maps them).

    click runs in non-standalone mode so that usage errors (2), ``--help`` (0), Ctrl-C
    (130) and our errors are all turned into exit codes here."""
    from kit.cli.output import error_json, json_mode, reset

    reset()
    try:
        # typer 0.29 vendors click: its usage errors are typer.TyperException subclasses
        # (exit_code 2 and a show()); Ctrl-C comes back as typer's Exit(130)
        code = app(args=argv, prog_name="mlx-kit", standalone_mode=False)
    except typer.TyperException as e:  # bad flags, missing arguments (before --json is read)
        show = getattr(e, "show", None)
        if show is not None:
            show()
        else:
            err_console.print(f"error: {e.message}", markup=False, highlight=False)
        code = e.exit_code
    except (KeyboardInterrupt, typer.Abort):
        err_console.print("interrupted", highlight=False)
        code = ExitCode.INTERRUPTED
    except SystemExit as e:
        if not _stdout_pipe_closed():
            raise
        code = ExitCode.BROKEN_PIPE  # click has already silenced stdout/stderr
    except BrokenPipeError:  # a write outside the command (never expected; same outcome)
        code = ExitCode.BROKEN_PIPE
    except KitError as e:
        code = int(e.exit_code)
        _print_error(e.message, e.hint)
        if json_mode():
            code = _emit_error(error_json(e.message, e.hint, code, type(e).__name__), code)
    except Exception as e:
        from rich.markup import escape

        from kit.paths import log_dir

        with tempfile.NamedTemporaryFile("w", prefix="crash-", suffix=".log", delete=False,
                                         dir=log_dir(create=True)) as f:
            traceback.print_exc(file=f)
        err_console.print(f"[bold red]unexpected error:[/] {type(e).__name__}: "
                          f"{escape(str(e))}\ndetails: {escape(f.name)}", highlight=False)
        code = ExitCode.SOFTWARE
        if isinstance(e, OSError):  # maybe stdout itself (>/dev/full): its buffer would
            _discard_stdout()       # fail again at exit (exit 120, "Exception ignored")
        elif json_mode():  # the crash may be stdout itself failing (>/dev/full): once only
            code = _emit_error(error_json(f"unexpected error: {type(e).__name__}: {e}",
                                          f"details: {f.name}", code, type(e).__name__),
                               code)
    if code == ExitCode.BROKEN_PIPE:
        _discard_stdout()
    sys.exit(int(code or 0))


def _stdout_pipe_closed() -> bool:
    """Whether click's EPIPE handler ran: on a BrokenPipeError from a command it wraps
    stdout/stderr in its ``PacifyFlushWrapper`` and calls ``sys.exit(1)`` (typer/core.py),
    which would make ``... --json | true`` fail with no message. The wrapper is the one
    sign it leaves (by name: typer vendors its own click)."""
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


def _emit_error(value: dict, code: int) -> int:
    """Print an error's JSON on stdout; returns ``code``, or :attr:`ExitCode.BROKEN_PIPE`
    when stdout's reader has left. Another failure to write (a full disk) is not raised
    again: the ``error:`` line on stderr already says what happened."""
    from kit.cli.output import emit_json

    try:
        emit_json(value)
    except BrokenPipeError:
        return ExitCode.BROKEN_PIPE
    except OSError:
        _discard_stdout()  # else the interpreter's last flush fails again (exit 120)
    return code


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null, so what is still buffered for stdout is dropped at exit
    instead of raising (and printing "Exception ignored ... BrokenPipeError") again: the
    Python docs' recipe for SIGPIPE (signal module, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def _print_error(message: str, hint: str | None) -> None:
    """``error: <message>`` and ``hint: <hint>`` on stderr, as text (messages name keys
    like [vars] and files[0]: never markup)."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if hint:
        err_console.print(f"[bold]hint:[/] {escape(hint)}", highlight=False)
