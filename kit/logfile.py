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
the rotation and the reopening themselves are the standard library's handlers.

Also here: :class:`HealthPolls`, the access-log filter that drops ``/health`` polls. The
readers behind ``mlx-kit logs`` (:func:`~kit.logread.last_lines`,
:class:`~kit.logread.Follower`) are :mod:`kit.logread`.
"""

from __future__ import annotations

import errno
import logging
import logging.handlers
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from kit.errors import ConfigError
from kit.paths import private_dir

from kit.knobs import env

#: Bytes of one log file before it is rotated, and how many rotated files are kept.
MAX_BYTES = 10 * 2**20
BACKUPS = 3
#: Hidden override of MAX_BYTES (bytes), for tests that rotate at a few KiB.
MAX_BYTES_ENV = "MLX_KIT_LOG_MAX_BYTES"
#: Set by ``serve --log-file`` for its engine process: the file it appends to.
LOG_FILE_ENV = "MLX_KIT_SERVER_LOG"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The mode a log file is created with: only its user reads it (it holds prompts, tokens
#: in command lines, paths).
FILE_MODE = 0o600
#: ``start_detached`` writes this before each start, so a tail can show the current run only.
RUN_SEPARATOR = "\n--- "
#: A line :data:`FORMAT` writes ("2026-12-01 21:58:44,123 INFO mlx_kit.serve: ..."), or
#: the run separator: how a file shows it is one of our logs (:func:`check_rotation_targets`).
_OUR_LINE = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(,\d{3})? [A-Z]+ \S+: |--- )",
                       re.MULTILINE)
#: Bytes read from the start of a file to decide whether it is ours.
_SNIFF_BYTES = 64 * 1024


def max_bytes() -> int:
    """:data:`MAX_BYTES`, or the hidden ``MLX_KIT_LOG_MAX_BYTES`` (at least 512)."""
    try:
        return max(512, int(env(MAX_BYTES_ENV) or ""))
    except ValueError:
        return MAX_BYTES


def _is_file(fd: int, path: Path) -> bool:
    """Whether the open descriptor ``fd`` is the file at ``path``."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class _StdStreams:
    """Points fds 1 and 2 (those that were the log file) at a handler's current stream."""

    def __init__(self, path: Path) -> None:
        self.fds = [fd for fd in (1, 2) if _is_file(fd, path)]

    def follow(self, stream) -> None:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (AttributeError, OSError, ValueError):
                pass
        for fd in self.fds:
            os.dup2(stream.fileno(), fd)


#: open(2) flags of every log file open: never through a link at the path itself (one
#: planted in a shared folder since the path was checked), never waiting on a FIFO
_SAFE_OPEN = getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK


def _ours(fd: int, path: Path | str) -> int:
    """``fd`` if it is a regular file of this user's, else closed and an OSError: a file
    another user put at the path (their own, which they can read) gets none of our log."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
        return fd
    os.close(fd)
    raise OSError(errno.EPERM, "not a regular file of this user's", str(path))


def open_ours(path: Path | str):
    """``path`` opened for reading (binary) when it is a regular file of this user's,
    not through a link at the path, without waiting on a FIFO (``mlx-kit logs``).

    Raises:
        OSError: it cannot be opened, or is not such a file (EPERM, ELOOP).
    """
    fd = _ours(os.open(path, os.O_RDONLY | _SAFE_OPEN), path)
    os.set_blocking(fd, True)
    return open(fd, "rb")


def open_private(path: Path | str, mode: str = "a", encoding: str | None = "utf-8",
                 errors: str | None = None):
    """Open ``path`` for appending (``mode`` "a" or "ab"), creating it with
    :data:`FILE_MODE` (0600) if missing; an existing file keeps its mode. Only a regular
    file of this user's, not through a link at the path (:func:`_ours`).

    Raises:
        OSError: it cannot be opened, or is not such a file (EPERM, ELOOP).
    """
    fd = _ours(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _SAFE_OPEN,
                       FILE_MODE), path)
    os.set_blocking(fd, True)
    if "b" in mode:
        return open(fd, mode)
    return open(fd, mode, encoding=encoding, errors=errors)


class _PrivateOpen:
    """Mixin for the stdlib file handlers: ``_open`` (used at start and by every
    rotation/reopen) creates the file 0600 instead of with the umask."""

    def _open(self):
        return open_private(self.baseFilename, self.mode, self.encoding, self.errors)


def looks_like_our_log(path: Path) -> bool:
    """Whether the file at ``path`` is empty or has, in its first 64 KiB, a line our
    :data:`FORMAT` or :data:`RUN_SEPARATOR` writes, or is this process's stdout/stderr
    (what started us opened it for us to log into). A missing file counts as ours (there
    is nothing to lose); an unreadable one does not.
    """
    if any(_is_file(fd, path) for fd in (1, 2)):
        return True
    try:
        with open_ours(path) as f:
            head = f.read(_SNIFF_BYTES)
    except FileNotFoundError:
        return True
    except OSError:  # unreadable, a link, a FIFO, another user's
        return False
    return not head or _OUR_LINE.search(head) is not None


def check_rotation_targets(path: Path) -> None:
    """Refuse a log file whose rotation would overwrite or delete files that are not
    ours: rotating renames ``path`` to ``path.1``, ``path.1`` to ``path.2``, ... and
    deletes the last (:data:`BACKUPS`), so each of ``path`` and ``path.1`` ..
    ``path.N`` must be missing, empty or one of our logs (:func:`looks_like_our_log`).

    Raises:
        ConfigError: naming the files that are not our logs.
    """
    names = [path] + [Path(f"{path}.{i}") for i in range(1, BACKUPS + 1)]
    foreign = [str(p) for p in names if os.path.lexists(p) and not looks_like_our_log(p)]
    if foreign:
        raise ConfigError(
            f"the log file's rotation would overwrite or delete files that are not mlx-kit "
            f"logs: {', '.join(foreign)}",
            hint="pass another --log-file, or move those files away")


def check_log_path(path: Path) -> None:
    """Refuse a ``--log-file`` (as the user spelt it, before links are resolved) that
    another user can put something at: its folder writable by every user without the
    sticky bit (they could rename our file away and put theirs in its place), or the
    path, or one of its rotation names, already someone else's (their file, or their
    link to a file of ours, in a shared ``/tmp``). What follows a check of the user's own
    paths is :func:`check_rotation_targets` on the resolved path.

    Raises:
        ConfigError: naming the folder or the files.
    """
    folder = os.path.realpath(path.parent)
    try:
        mode = os.stat(folder).st_mode
    except OSError:
        return  # missing: created 0700 by us (private_dir)
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise ConfigError(f"refusing the log file {path}: every user may write in "
                          f"{folder} (and replace the log with a file of theirs)",
                          hint="pass a --log-file in a folder of yours")
    names = [path] + [Path(f"{path}.{i}") for i in range(1, BACKUPS + 1)]
    others = []
    for p in names:
        try:
            if os.lstat(p).st_uid != os.geteuid():
                others.append(str(p))
        except OSError:
            pass
    if others:
        raise ConfigError(f"refusing the log file {path}: another user owns "
                          f"{', '.join(others)}; mlx-kit's log (prompts, paths) would be "
                          "theirs to read, or go where their link points",
                          hint="pass another --log-file, in a folder of yours")


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
