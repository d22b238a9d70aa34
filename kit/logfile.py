"""The server's log file: rotated by size, written by the server and its engine process.

``mlx-kit serve --log-file PATH`` (a detached server's is ``<log dir>/server-<port>.log``)
logs through one :class:`ServerLogFile`: before a record would take the file past
:data:`MAX_BYTES` (10 MiB), PATH becomes PATH.1, PATH.1 becomes PATH.2, ... and the oldest
of :data:`BACKUPS` (3) is deleted, so a server never keeps more than about 40 MiB of log.
Renaming is safe only where nobody else can make names: in a folder another user may
write (a sticky ``/tmp`` included: a name we have not made yet, ``PATH.1``, is theirs to
take), PATH is never renamed, and is emptied in place when it reaches 4 x MAX_BYTES
(:func:`rotates`), as logrotate refuses a parent with "insecure permissions". A rotation
that finds a name it must not touch, or fails, is one logged line and the same in-place
emptying from then on: it never deletes, renames over or writes another user's file.
The engine process (a ``python -c`` child: it inherits the environment) appends to the
same file through an :class:`EngineLogFile`, which follows the server's rotation; only the
server rotates, so the two never rename the file under each other.

When the process's stdout/stderr already are that file (a detached server: ``launch`` and
``serve --detach`` start it so, and so do the tests), they are pointed at each new file
after a rotation too, so stray output (a warning printed by a library, a crash report)
lands in the current log and not in a rotated or deleted one. Else (``--log-file`` in a
terminal) the records also go to stderr, as without ``--log-file``.

No library does the "follow the other process's rotation and move fds 1/2 along" part;
the handlers are the standard library's, with the rotation itself our own
(:meth:`ServerLogFile.doRollover`: the stdlib's deletes whatever is at ``PATH.N``). Which
files are ours, and the ``--log-file`` checks, are :mod:`kit.logpaths`.

Also here: :class:`HealthPolls`, the access-log filter that drops ``/health`` polls. The
readers behind ``mlx-kit logs`` (:func:`~kit.logread.last_lines`,
:class:`~kit.logread.Follower`) are :mod:`kit.logread`.
"""

from __future__ import annotations

import collections
import errno
import logging
import logging.handlers
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from kit.errors import ConfigError
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
    rotates,
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
    the server's records.

    Its rotation is its own (:meth:`doRollover`): the stdlib's removes and renames
    whatever is at ``PATH.N`` and raises on the first failure, once per record after
    that. Here each name is checked first (missing, or a regular file of ours that this
    handler wrote or that holds our log), the open file is kept until the new one is open, and a rotation
    that cannot be done safely, or where it is never done (:func:`rotates`), empties the
    file in place at 4 x the size instead (:attr:`no_rotation` says why).

    Attributes:
        no_rotation: None while the file is rotated by renaming, else why it is not.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, maxBytes=max_bytes(), backupCount=BACKUPS, encoding="utf-8")
        self.std = _StdStreams(path)
        self.std.follow(self.stream)  # O_APPEND from now on, whatever the parent opened
        self.no_rotation: str | None = None
        #: (st_dev, st_ino) of the last files this handler wrote: backups known ours
        #: whatever their lines look like (older ones have been deleted by rotation)
        self._written = collections.deque([self._identity(self.stream)], maxlen=BACKUPS + 2)
        if why := rotates(path):
            self._stop_rotating(why)

    def _stop_rotating(self, why: str) -> None:
        # the same disk bound as PATH plus its backups: one file of 4 x the size
        self.no_rotation = why
        self.maxBytes = max_bytes() * (BACKUPS + 1)

    def _note(self, text: str) -> None:
        """A WARNING line written straight to the file (FileHandler.emit: no size check,
        so no rotation from inside a rotation), as the server's logger would."""
        record = logging.LogRecord("mlx_kit.serve", logging.WARNING, __file__, 0, text,
                                   None, None)
        logging.FileHandler.emit(self, record)

    @staticmethod
    def _identity(stream) -> tuple[int, int]:
        st = os.fstat(stream.fileno())
        return st.st_dev, st.st_ino

    def _backup(self, name: Path) -> bool:
        """Whether ``name`` exists, when it is missing or a backup of ours: a regular file
        of this user's that this handler wrote, or that holds our log (one from before).

        Raises:
            OSError: something else is at ``name``: renaming onto it would replace it, and
                renaming it along would push it to where the oldest backup is deleted.
        """
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or (
                (st.st_dev, st.st_ino) not in self._written and not looks_like_our_log(name)):
            raise OSError(errno.EEXIST, "in the way of the rotation, and not a log of ours",
                          str(name))
        return True

    def _rotate(self) -> None:
        """Rename PATH.N-1 onto PATH.N ... PATH onto PATH.1, each name checked first.

        Raises:
            OSError: a name in the way is not ours (nothing renamed onto it or away), PATH
                is no longer our open file, or a rename fails.
        """
        base = self.baseFilename
        for i in range(self.backupCount - 1, 0, -1):
            src, dst = Path(f"{base}.{i}"), Path(f"{base}.{i + 1}")
            if self._backup(src):
                self._backup(dst)  # raises when what is in the way is not ours
                os.rename(src, dst)
        if not same_file(self.stream.fileno(), Path(base)):
            raise OSError(errno.ENOENT, "no longer the file this server writes", base)
        self._backup(Path(f"{base}.1"))  # likewise
        os.rename(base, f"{base}.1")

    def doRollover(self) -> None:
        """Rotate (see the class docstring), or empty the file where it is not rotated.
        Never raises: a rotation that fails is one line in the log, and the end of
        rotating for this server."""
        if self.no_rotation is not None:
            self._empty()
            return
        old = self.stream
        try:
            old.flush()  # the old file is complete before it is renamed
            self._rotate()
            self.stream = self._open()
        except OSError as e:
            self.stream = old  # still ours, wherever its name is now
            moved = Path(f"{self.baseFilename}.1")
            if same_file(old.fileno(), moved) and not os.path.lexists(self.baseFilename):
                try:  # renamed, then no new file: give it its name back
                    os.rename(moved, self.baseFilename)
                except OSError:
                    pass
            self._stop_rotating(f"cannot rotate it: {e.filename or self.baseFilename}: "
                                f"{e.strerror}")
            self._note(f"the log file {self.baseFilename} is no longer rotated "
                       f"({self.no_rotation}); it is emptied in place at "
                       f"{_size(self.maxBytes)} instead")
            return
        old.close()
        self._written.append(self._identity(self.stream))
        self.std.follow(self.stream)

    def _empty(self) -> None:
        """Empty the file through our own open descriptor (no name is touched): the
        engine's and fds 1/2's appends (O_APPEND) go on at its new end."""
        try:
            self.stream.flush()
            os.ftruncate(self.stream.fileno(), 0)
        except OSError as e:
            self._note(f"cannot empty the log file: {e.strerror}")
            return
        self._note(f"the log file was emptied at {_size(self.maxBytes)}: it is not rotated "
                   f"({self.no_rotation}); pass a --log-file in a folder only you can "
                   f"write to keep {BACKUPS} rotated files")


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n} bytes"


class EngineLogFile(_PrivateOpen, logging.handlers.WatchedFileHandler):
    """The engine process's handler: appends to the server's file and reopens it when
    the server has rotated it (WatchedFileHandler compares the path's inode at each
    record), moving fds 1/2 along when they were the file."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.std = _StdStreams(path)

    def reopenIfNeeded(self) -> None:
        """The stdlib's check (the path's inode against the open file's), except that a
        path that cannot be opened as a file of ours (another user's file put there after
        they moved our folder away, a link, a FIFO) keeps the file we have: the stdlib's
        closes it first, then raises out of every logging call, which ended the engine
        process (and each one restarted after it)."""
        if self.stream is None:
            return
        try:
            st = os.stat(self.baseFilename)
            if (st.st_dev, st.st_ino) == (self.dev, self.ino):
                return
        except FileNotFoundError:
            pass  # renamed by the server's rotation: a new one is made (O_CREAT)
        except OSError:
            return
        try:
            new = self._open()
        except OSError:
            return  # not ours to write: the records go on into our own file
        old, self.stream = self.stream, new
        try:
            old.flush()
            old.close()
        except OSError:
            pass
        self._statstream()
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
            (:func:`check_rotation_targets`), or it cannot be opened as a file of ours.
    """
    if log_file is not None:
        check_rotation_targets(log_file)
    try:
        handlers = _handlers(log_file, ServerLogFile)
    except OSError as e:  # what the checks saw changed before the open (another user)
        raise ConfigError(f"cannot open the log file {log_file}: {e.strerror or e}",
                          hint="pass a --log-file in a folder only you can write") from None
    logging.basicConfig(level=logging.INFO, format=FORMAT, force=True, handlers=handlers)
    logging.getLogger("mlx_kit").setLevel(level.upper())
    logging.getLogger("uvicorn.access").addFilter(HealthPolls())
    if log_file is not None:
        os.environ[LOG_FILE_ENV] = str(log_file)
        why = getattr(handlers[0], "no_rotation", None)
        if why:  # said once at start: the user chose the folder, and can choose another
            logging.getLogger("mlx_kit.serve").warning(
                "the log file %s is not rotated: %s, so another user could take the "
                "names its rotation renames onto; it is emptied in place when it reaches "
                "%s. Pass a --log-file in a folder only you can write to keep %d rotated "
                "files", log_file, why, _size(handlers[0].maxBytes), BACKUPS)
    else:  # not one inherited from whatever started us
        os.environ.pop(LOG_FILE_ENV, None)


def setup_engine(level: int) -> None:
    """Configure the engine process's logging like its server's: the server's log file
    (from the environment) or stderr; ``mlx_kit`` at ``level``."""
    path = env(LOG_FILE_ENV)
    try:
        handlers = _handlers(Path(path) if path else None, EngineLogFile)
        why = None
    except OSError as e:  # no longer a file of ours: stderr (the server's) rather than exit
        handlers, why = _handlers(None, EngineLogFile), e.strerror or str(e)
    logging.basicConfig(level=logging.INFO, format=FORMAT, force=True, handlers=handlers)
    logging.getLogger("mlx_kit").setLevel(level)
    if why:
        logging.getLogger("mlx_kit.engine").warning(
            "the engine process logs to stderr: cannot open the log file %s: %s", path, why)
