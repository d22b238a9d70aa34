"""Which log files are ours (:mod:`kit.logfile` writes them, :mod:`kit.logread` reads
them): every open takes only a regular file of this user's, never through a link at the
path, never waiting on a FIFO; a file counts as one of our logs by its lines; and the
``--log-file`` checks made before the server logs a line (:func:`check_log_path`,
:func:`check_rotation_targets`), including whether the file is rotated at all
(:func:`rotates`: not in a folder another user may write).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from kit.errors import ConfigError
from kit.owners import other_writers, shared_folder

#: How many rotated files are kept (``PATH.1`` .. ``PATH.3``).
BACKUPS = 3
#: The mode a log file is created with: only its user reads it (it holds prompts, tokens
#: in command lines, paths).
FILE_MODE = 0o600
#: ``start_detached`` writes this before each start, so a tail can show the current run only.
RUN_SEPARATOR = "\n--- "
#: A line :data:`kit.logfile.FORMAT` writes ("2026-12-01 21:58:44,123 INFO mlx_kit.serve: ..."), or
#: the run separator: how a file shows it is one of our logs (:func:`check_rotation_targets`).
_OUR_LINE = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(,\d{3})? [A-Z]+ \S+: |--- )",
                       re.MULTILINE)
#: Bytes read from the start of a file to decide whether it is ours.
_SNIFF_BYTES = 64 * 1024


def same_file(fd: int, path: Path | str) -> bool:
    """Whether the open descriptor ``fd`` is the file at ``path``."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


#: open(2) flags of every log file open: never through a link at the path itself (one
#: planted in a shared folder since the path was checked), never waiting on a FIFO
_SAFE_OPEN = getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK


def _ours(fd: int, path: Path | str, write: bool = False) -> int:
    """``fd`` if it is a regular file of this user's (for ``write``: with no other name),
    else closed and an OSError: a file another user put at the path (their own, which
    they can read) gets none of our log, and a hard link another user made there to a
    file of ours (macOS allows one to any file, Linux without fs.protected_hardlinks)
    is never appended to or emptied: its other name is a file that is not our log."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
        if not write or st.st_nlink <= 1:
            return fd
        os.close(fd)
        raise OSError(errno.EPERM, f"a file with {st.st_nlink} names (hard links): its "
                      "other names are not our log", str(path))
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
    file of this user's with no other name, not through a link at the path
    (:func:`_ours`).

    Raises:
        OSError: it cannot be opened, or is not such a file (EPERM, ELOOP).
    """
    fd = _ours(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _SAFE_OPEN,
                       FILE_MODE), path, write=True)
    os.set_blocking(fd, True)
    if "b" in mode:
        return open(fd, mode)
    return open(fd, mode, encoding=encoding, errors=errors)


def looks_like_our_log(path: Path) -> bool:
    """Whether the file at ``path`` is empty or has, in its first 64 KiB, a line our
    :data:`kit.logfile.FORMAT` or :data:`RUN_SEPARATOR` writes, or is this process's stdout/stderr
    (what started us opened it for us to log into). A missing file counts as ours (there
    is nothing to lose); an unreadable one does not.
    """
    if any(same_file(fd, path) for fd in (1, 2)):
        return True
    try:
        with open_ours(path) as f:
            head = f.read(_SNIFF_BYTES)
    except FileNotFoundError:
        return True
    except OSError:  # unreadable, a link, a FIFO, another user's
        return False
    return not head or _OUR_LINE.search(head) is not None


def rotates(path: Path) -> str | None:
    """None when the log at ``path`` is rotated by renaming, else why not: its folder
    (resolved) is another user's or others may write it (:func:`kit.owners.shared_folder`),
    so a rotation name (``path.1``...) could be theirs by the time we rename onto it."""
    return shared_folder(os.path.realpath(path.parent))


def _rotation_names(path: Path) -> list[Path]:
    """``path`` and, when it is rotated (:func:`rotates`), ``path.1`` .. ``path.N``."""
    if rotates(path):
        return [path]
    return [path] + [Path(f"{path}.{i}") for i in range(1, BACKUPS + 1)]


def _other_names(path: Path) -> bool:
    """Whether the regular file at ``path`` (not through a link) has more than one name."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink > 1


def check_rotation_targets(path: Path) -> None:
    """Refuse a log file whose rotation would overwrite or delete files that are not
    ours: rotating renames ``path`` to ``path.1``, ``path.1`` to ``path.2``, ... and
    deletes the last (:data:`BACKUPS`), so each of ``path`` and ``path.1`` ..
    ``path.N`` must be missing, empty or one of our logs (:func:`looks_like_our_log`),
    and ``path`` must have no other name (a hard link to a file of ours elsewhere is not
    our log: it is appended to and emptied in place). A log that is not rotated
    (:func:`rotates`) has only ``path`` to check.

    Raises:
        ConfigError: naming the files that are not our logs, or ``path`` with other names.
    """
    names = _rotation_names(path)
    foreign = [str(p) for p in names if os.path.lexists(p) and not looks_like_our_log(p)]
    if foreign:
        raise ConfigError(
            f"the log file's rotation would overwrite or delete files that are not mlx-kit "
            f"logs: {', '.join(foreign)}",
            hint="pass another --log-file, or move those files away")
    if _other_names(path):  # (a backup's other name is safe: a rename moves one name)
        raise ConfigError(
            f"refusing the log file {path}: it has other names (hard links), which may be "
            "files that are not mlx-kit logs: appending to it or emptying it would change "
            "them too", hint="pass another --log-file, or move that file away")


def check_log_path(path: Path) -> None:
    """Refuse a ``--log-file`` (as the user spelt it, before links are resolved) that
    another user can put something at: its folder another user's (a sticky bit does not
    bind a folder's owner) or writable by its group or every user without the sticky bit
    (they could rename our file away and put theirs in its place), or the path already
    someone else's (their file, or their link to a file of ours, in a shared ``/tmp``),
    or, where the log is rotated (:func:`rotates`), one of its rotation names, or a
    folder on the way a link of another user's (as fs.protected_symlinks refuses in a
    sticky folder, which macOS does not have). What follows a check of the user's own paths is
    :func:`check_rotation_targets` on the resolved path.

    Raises:
        ConfigError: naming the folder or the files.
    """
    for part in path.parents:  # (the path itself: below, with the rotation names)
        try:
            link = os.lstat(part)
        except OSError:
            continue
        if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.geteuid(), 0):
            raise ConfigError(f"refusing the log file {path}: {part} is a link of another "
                              f"user's (uid {link.st_uid}): they chose where the log goes",
                              hint="pass a --log-file in a folder of yours")
    folder = os.path.realpath(path.parent)
    try:
        st = os.stat(folder)
    except OSError:
        return  # missing: created 0700 by us (private_dir)
    who = other_writers(st, folder)
    if who and not st.st_mode & stat.S_ISVTX:
        whom = "every user" if st.st_mode & stat.S_IWOTH else "every member of its group"
        raise ConfigError(f"refusing the log file {path}: {whom} may write in "
                          f"{folder} (and replace the log with a file of theirs)",
                          hint="pass a --log-file in a folder of yours")
    if st.st_uid not in (os.geteuid(), 0):
        raise ConfigError(f"refusing the log file {path}: {folder} belongs to another user "
                          f"(uid {st.st_uid}), who may rename or delete the log there and put "
                          "a file of theirs in its place",
                          hint="pass a --log-file in a folder of yours")
    others = []
    for p in _rotation_names(path):
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
