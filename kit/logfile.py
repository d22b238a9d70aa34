"""The server's log file: rotated by size, written by the server and its engine process.

``mlx-kit serve --log-file PATH`` (a detached server's is ``<log dir>/server-<port>.log``)
logs through one :class:`ServerLogFile`: before a record would take the file past
:data:`MAX_BYTES` (10 MiB), PATH becomes PATH.1, PATH.1 becomes PATH.2, ... and the oldest
of :data:`BACKUPS` (3) is deleted, so a server never keeps more than about 40 MiB of log.
The engine process (a ``python -c`` child: it inherits the environment) appends to the
same file through an :class:`EngineLogFile`, which follows the server's rotation; only the
server rotates, so the two never rename the file under each other.

When the process's stdout/stderr already are that file (a detached server: ``launch`` and
``serve --detach`` start it so, and so do the tests), they are pointed at each new file
after a rotation too, so stray output (a warning printed by a library, a crash report)
lands in the current log and not in a rotated or deleted one. Else (``--log-file`` in a
terminal) the records also go to stderr, as without ``--log-file``.

No library does the "follow the other process's rotation and move fds 1/2 along" part;
the rotation and the reopening themselves are the standard library's handlers. Which
files are ours, and the ``--log-file`` checks, are :mod:`kit.logpaths`.

Also here: :class:`HealthPolls`, the access-log filter that drops ``/health`` polls. The
readers behind ``mlx-kit logs`` (:func:`~kit.logread.last_lines`,
:class:`~kit.logread.Follower`) are :mod:`kit.logread`.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from collections.abc import Callable
from pathlib import Path

from kit.knobs import env
from kit.logpaths import (  # noqa: F401 (re-exported: callers import them from here)
    BACKUPS,
    FILE_MODE,
    RUN_SEPARATOR,
    check_log_path,
    check_rotation_targets,
    looks_like_our_log,
    open_ours,
    open_private,
    same_file,
)
from kit.paths import private_dir

#: Bytes of one log file before it is rotated (BACKUPS: how many rotated files are kept).
MAX_BYTES = 10 * 2**20
#: Hidden override of MAX_BYTES (bytes), for tests that rotate at a few KiB.
MAX_BYTES_ENV = "MLX_KIT_LOG_MAX_BYTES"
#: Set by ``serve --log-file`` for its engine process: the file it appends to.
LOG_FILE_ENV = "MLX_KIT_SERVER_LOG"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def max_bytes() -> int:
    """:data:`MAX_BYTES`, or the hidden ``MLX_KIT_LOG_MAX_BYTES`` (at least 512)."""
    try:
        return max(512, int(env(MAX_BYTES_ENV) or ""))
    except ValueError:
        return MAX_BYTES


class _StdStreams:
    """Points fds 1 and 2 (those that were the log file) at a handler's current stream."""

    def __init__(self, path: Path) -> None:
        self.fds = [fd for fd in (1, 2) if same_file(fd, path)]

    def follow(self, stream) -> None:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (AttributeError, OSError, ValueError):
                pass
        for fd in self.fds:
            os.dup2(stream.fileno(), fd)


class _PrivateOpen:
    """Mixin for the stdlib file handlers: ``_open`` (used at start and by every
    rotation/reopen) creates the file 0600 instead of with the umask."""

    def _open(self):
        return open_private(self.baseFilename, self.mode, self.encoding, self.errors)


class ServerLogFile(_PrivateOpen, logging.handlers.RotatingFileHandler):
    """The server's handler: a RotatingFileHandler (:func:`max_bytes`, :data:`BACKUPS`)
    that also moves fds 1/2 to the new file after a rotation (when they were the file).

    Its size check counts the engine's lines too (it measures the file, not its own
    writes), so the file passes the limit only by what the engine writes between two of
    the server's records."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, maxBytes=max_bytes(), backupCount=BACKUPS, encoding="utf-8")
        self.std = _StdStreams(path)
        self.std.follow(self.stream)  # O_APPEND from now on, whatever the parent opened

    def doRollover(self) -> None:
        super().doRollover()
        self.std.follow(self.stream)


class EngineLogFile(_PrivateOpen, logging.handlers.WatchedFileHandler):
    """The engine process's handler: appends to the server's file and reopens it when
    the server has rotated it (WatchedFileHandler compares the path's inode at each
    record), moving fds 1/2 along when they were the file."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.std = _StdStreams(path)

    def reopenIfNeeded(self) -> None:
        before = self.stream
        super().reopenIfNeeded()
        if self.stream is not before and self.stream is not None:
            self.std.follow(self.stream)


#: Paths polled on a timer, left out of the access log: ``/health`` (``launch`` polls it 4
#: times a second while a server starts; ``status`` and agents' checks too), the status
#: page's ``/ui/data`` (once a second per open tab) and ``/metrics`` (each scrape).
POLLED_PATHS = frozenset({"/health", "/ui/data", "/metrics"})


class HealthPolls(logging.Filter):
    """Drops uvicorn's access-log lines of :data:`POLLED_PATHS`; every other request
    stays. Reads the record's args, ``(client, method, path, http_version, status)``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return args[2].split("?", 1)[0] not in POLLED_PATHS
        return True


def _handlers(path: Path | None, make: Callable[[Path], logging.Handler]
              ) -> list[logging.Handler]:
    if path is None:
        return [logging.StreamHandler()]

    private_dir(path.parent)
    handler = make(path)
    if handler.std.fds:  # type: ignore[attr-defined]
        return [handler]
    return [handler, logging.StreamHandler()]  # a terminal: it shows the log too


def setup_server(level: str, log_file: Path | None) -> None:
    """Configure the ``serve`` process's logging: the root logger at INFO into
    ``log_file`` (rotated, see the module doc) or stderr, ``mlx_kit`` at ``level``
    ("debug", "info", ...), ``/health`` out of uvicorn's access log. With a log file, its
    path goes into the environment for the engine process (:func:`setup_engine`).

    Raises:
        ConfigError: ``log_file``'s rotation would destroy files that are not our logs
            (:func:`check_rotation_targets`).
    """
    if log_file is not None:
        check_rotation_targets(log_file)
    logging.basicConfig(level=logging.INFO, format=FORMAT, force=True,
                        handlers=_handlers(log_file, ServerLogFile))
    logging.getLogger("mlx_kit").setLevel(level.upper())
    logging.getLogger("uvicorn.access").addFilter(HealthPolls())
    if log_file is not None:
        os.environ[LOG_FILE_ENV] = str(log_file)
    else:  # not one inherited from whatever started us
        os.environ.pop(LOG_FILE_ENV, None)


def setup_engine(level: int) -> None:
    """Configure the engine process's logging like its server's: the server's log file
    (from the environment) or stderr; ``mlx_kit`` at ``level``."""
    path = env(LOG_FILE_ENV)
    logging.basicConfig(level=logging.INFO, format=FORMAT, force=True,
                        handlers=_handlers(Path(path) if path else None, EngineLogFile))
    logging.getLogger("mlx_kit").setLevel(level)
