"""``mlx-kit logs``: print (and follow) the log of the server on a port."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from kit.cli.console import err_console
from kit.cli.output import json_option
from kit.errors import ServerError, ServerNotRunningError

#: The most lines ``-n`` prints (a log file is rotated at 10 MiB: far fewer lines).
MAX_LINES = 1_000_000


def _log_of(port: int) -> tuple[Path, bool]:
    """The log file of the server on ``port`` and whether that server runs.

    The running server's pid file names its log; with no server running, the log the
    last detached server on that port wrote (``<log dir>/server-<port>.log``), or the one
    a stale pid file names.

    Raises:
        ServerError: the server runs in the foreground without a log file.
        ServerNotRunningError: (3) no server runs and no log exists.
    """
    from kit.daemon import log_file, read_pid_file, running_server_info
    from kit.urls import parse_url

    url = parse_url(f"http://127.0.0.1:{port}")
    info = running_server_info(url)
    if info is not None:
        if info.get("log"):
            return Path(info["log"]), True
        raise ServerError(f"the server on port {port} (pid {info.get('pid')}) runs in the "
                          "foreground and logs to the terminal it was started in",
                          hint="read it there, or start it with `mlx-kit serve --log-file "
                               "FILE` (or `mlx-kit launch`, which logs to a file)")
    stale = (read_pid_file(url) or {}).get("log")
    for path in ([Path(stale)] if stale else []) + [log_file(url)]:
        if path.is_file():
            return path, False
    raise ServerNotRunningError(f"no mlx-kit server is running on port {port}, and none "
                                f"has left a log ({log_file(url)})")


def _as_json(text: str) -> str:
    """Whole log lines (each ending in a newline) as JSON Lines, a record each
    (:func:`kit.logread.record`)."""
    from kit.logread import record

    lines = text.split("\n")
    if lines[-1] == "":  # the newline ending the last line
        lines.pop()
    return "".join(json.dumps(record(line), ensure_ascii=False) + "\n" for line in lines)


def _after_last_newline(f, size: int) -> int:
    """The offset just after the last newline in the last 64 KiB before ``size`` of the
    binary file ``f`` (``size`` when there is none: a line that long is printed cut)."""
    pos = max(0, size - 64 * 1024)
    f.seek(pos)
    cut = f.read(size - pos).rfind(b"\n")
    return pos + cut + 1 if cut >= 0 else (0 if pos == 0 else size)


def logs(
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing what the "
                                "server writes (across its log's rotation) until Ctrl-C."),
    lines: int = typer.Option(50, "--lines", "-n", min=0, max=MAX_LINES,
                              help="Print this many of the last lines first."),
    port: Optional[int] = typer.Option(None, "--port", "-p", min=1, max=65535,
                                       help="The server's port (default: MLX_KIT_URL's, "
                                            "else 8090)."),
    json_out: bool = json_option("Print each log line as one JSON object on a line of its "
                                 "own (JSON Lines: time, level, logger, message), with -f "
                                 'too; an error as {"error": {...}}.'),
) -> None:
    """Print the last lines of the mlx-kit server's log (-f: keep following it;
    --json: each line as a JSON object).

    The log of a detached server (`mlx-kit launch`, `serve --log-file`),
    by default <log dir>/server-<port>.log: rotated at 10 MiB, with 3
    backups kept (.1 to .3). With no server running: the last server's
    log, if there is one.

    \b
    Exit codes:
      0  printed (with -f: stopped by Ctrl-C)
      1  the server runs in the foreground without a log file (the message says where)
      3  no server is running on that port and there is no log
    """
    from kit.logfile import open_ours
    from kit.logread import Follower, last_lines
    from kit.urls import parse_url

    path, running = _log_of(port or parse_url(None).port)
    if not running:
        err_console.print(f"no server is running on this port; its last log: {path}",
                          markup=False)
    try:
        # One handle for both: the size is that file's, and -f follows that file, even
        # when the server rotates it between the two.
        log = open_ours(path)  # a regular file of ours: not a FIFO, not another user's
    except OSError as e:
        raise ServerError(f"cannot read {path}: {e.strerror}") from None
    try:
        start = os.fstat(log.fileno()).st_size
        if follow:  # a last line not ended yet is printed whole, by the follower
            start = _after_last_newline(log, start)
        text = "\n".join(last_lines(path, lines, end=start, file=log))
    except OSError as e:
        log.close()
        raise ServerError(f"cannot read {path}: {e.strerror}") from None
    out = sys.stdout
    shown = _as_json if json_out else (lambda chunk: chunk)
    follower = Follower(path, start=start, file=log)
    try:
        if text:
            out.write(shown(text + "\n"))
        out.flush()
        if follow:
            for chunk in follower:
                out.write(shown(chunk))
                out.flush()
    except KeyboardInterrupt:  # Ctrl-C is how -f ends: not an error
        if follower.pending:
            out.write(shown(follower.pending + "\n"))
            out.flush()
    except BrokenPipeError:  # `mlx-kit logs -f | head`: the reader is done, so are we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        log.close()
