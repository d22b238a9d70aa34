"""What the commands print: ``--json`` (one JSON document on stdout, nothing else there)
and plain tables that never break a word.

A command that reports takes :data:`JSON`; its callback records the choice, so that
``kit.cli.main`` prints an error as JSON too when the command was asked for JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

import typer

_state = {"json": False}


def _record_json(value: bool) -> bool:
    if value:
        _state["json"] = True
    return value


JSON = typer.Option(False, "--json", callback=_record_json,
                    help="Print one JSON object on stdout instead of text (errors too: "
                         '{"error": {...}}).')


def json_option(help: str) -> Any:
    """A ``--json`` option with its own ``help`` (a command whose JSON is not one object,
    e.g. ``logs``' JSON Lines), recorded as :data:`JSON` is."""
    return typer.Option(False, "--json", callback=_record_json, help=help)


def json_mode() -> bool:
    """Whether the running command was given ``--json``."""
    return _state["json"]


def reset() -> None:
    """Forget an earlier command's ``--json`` (``main`` may run more than once in a
    process, e.g. in tests)."""
    _state["json"] = False


def emit_json(value: Any) -> None:
    """Write ``value`` as one indented JSON document (and a newline) on stdout: plain
    ``json``, no rich markup or highlighting, so that ``| jq`` always parses it."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")
    sys.stdout.flush()


def error_json(message: str, hint: str | None, exit_code: int, kind: str) -> dict:
    """The ``--json`` form of an error: ``{"error": {"message", "hint", "exit_code",
    "type"}}`` (``type``: the error class, e.g. ``ServerNotRunningError``)."""
    return {"error": {"message": message, "hint": hint, "exit_code": int(exit_code),
                      "type": kind}}


def print_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print rows under headers in aligned plain-text columns, like ``docker ps``: no
    borders, no colour, and no cell is ever wrapped, folded or cut (model ids and paths
    stay whole and can be copied); a line wider than the terminal is left to the terminal
    to wrap.

    rich's Table lays the columns out; it is rendered into a string at its natural width,
    not the terminal's, because at a narrower width rich folds or truncates cells."""
    import io

    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, show_edge=False, header_style="",
                  padding=(0, 2, 0, 0))
    for name in headers:
        table.add_column(name, no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))  # text, never markup
    sizing = Console(width=10**6, file=io.StringIO())
    width = max(Measurement.get(sizing, sizing.options, table).maximum, 1)
    out = io.StringIO()
    Console(width=width, file=out, color_system=None, highlight=False).print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in out.getvalue().splitlines()))
    sys.stdout.flush()
