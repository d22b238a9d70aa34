"""Safe file writes: atomic replace, created-folder tracking, writability checks, and
file-system errors reported as :class:`HarnessError`.

``os.replace`` of a temp file in the same folder is atomic on POSIX and Windows; no library
in our stack offers "write text atomically + tell me which parent folders you created".
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from kit.errors import HarnessError
from kit.harness.places import forbidden
from kit.owners import other_writers


@contextmanager
def file_errors(action: str):
    """Report a file-system failure (read-only folder, permissions) as a HarnessError
    naming ``action`` ("write pi's config") and the file."""
    try:
        yield
    except OSError as e:
        raise HarnessError(f"cannot {action}: {e.strerror or e}"
                           + (f": {e.filename}" if e.filename else ""),
                           hint="check the folder's permissions") from None


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


#: The largest file :func:`read_text` reads (an agent's config file is a few KiB).
MAX_CONFIG_BYTES = 16 * 2**20


def read_text(path: Path, errors: str = "strict") -> str:
    """A file's text exactly as stored: UTF-8, line endings untranslated (``Path.read_text``
    turns ``\r\n`` into ``\n``, so a CRLF file would not come back byte for byte).

    At most :data:`MAX_CONFIG_BYTES` are read: an agent's config file is KiB, and a
    multi-GB file at its path (a log, a disk image linked there) must not be read whole.

    Raises:
        HarnessError: ``errors="strict"`` and the file is not UTF-8 (mlx-kit never changes
            or backs up a file it cannot read as text: its bytes would not come back); or
            it is larger than :data:`MAX_CONFIG_BYTES`.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise HarnessError(f"{path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB: not an "
                           "agent's config file; mlx-kit changes nothing in it",
                           hint="move it away, or check the agent's config folder")
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise HarnessError(f"{path} is not UTF-8 text (byte {data[e.start]:#04x} at offset "
                           f"{e.start}); mlx-kit changes nothing in it",
                           hint="fix or move the file, then run the command again") from None


def make_parents(path: Path) -> list[Path]:
    """Create ``path``'s missing parent folders. Returns those created, outermost first."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        folder.mkdir()
    return list(reversed(missing))


def check_writable(path: Path, action: str = "write", through_link: bool = False) -> None:
    """Refuse to change ``path`` when it is not a regular file or is read-only, or when its
    folder does not let us create the temporary file an atomic write needs (with
    ``through_link``, the folder of the file a symbolic link at ``path`` points to: see
    :func:`atomic_write`).

    The file's write bits are checked as well as ``os.access``: root may write any file, but
    a file the user made read-only (``chmod a-w``) says "leave me alone" to root too.

    Raises:
        HarnessError: naming ``path`` (never a temporary file), with what to do.
    """
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else \
            "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        if not (stat.S_ISLNK(st.st_mode) and path.is_file()):  # a link to a file is fine
            raise HarnessError(f"cannot {action} {path}: it is {kind}, not a file",
                               hint="move it away, then run the command again")
    if st is not None and path.is_file() and (
            not os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
            or not os.access(path, os.W_OK)):
        raise HarnessError(f"cannot {action} {path}: the file is read-only; mlx-kit does not "
                           "change a read-only file", hint=f"make it writable (chmod u+w "
                           f"{path}) and run the command again")
    if through_link and path.is_symlink() and path.is_file():
        path = path.resolve()
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise HarnessError(f"cannot {action} {path}: {folder} is a file, not a folder",
                           hint="move it away, then run the command again")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HarnessError(f"cannot {action} {path}: the folder {folder} is not writable",
                           hint="check the folder's permissions")


def atomic_write(path: Path, text: str, mode: int | None = None,
                 through_link: bool = False) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never half of one.

    ``os.replace`` replaces a symbolic link at ``path`` with a regular file. With
    ``through_link`` the file it points to is replaced instead and the link stays: a user's
    own settings file that links into their dotfiles must stay that link (mlx-kit's own
    drop-ins replace a link, since the path, not what it pointed to, is ours).

    Raises:
        IsADirectoryError: ``path`` is a folder (the error names ``path``).
        OSError: the folder cannot be written.
    """
    if through_link and path.is_symlink() and path.is_file():
        path = path.resolve()
    if path.is_dir():  # os.replace would fail naming the temporary file instead
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        elif path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: what to do about an :class:`UnsafeFile` of the user's config folder
UNSAFE_HINT = ("copy the file into the folder (or link the whole folder), or link to a file of "
               "yours at the same place of a dotfiles tree (as stow links "
               "~/.config/mlx-kit/harnesses/x.toml to "
               "~/.dotfiles/mlx-kit/.config/mlx-kit/harnesses/x.toml) that only you can "
               "change, or to a /nix/store file: mlx-kit reads no FIFO or device, nothing "
               "that large, and no link to another user's file, a file others can change, "
               "a file kept elsewhere or a place that holds keys")

#: Nix's store: its files belong to root, read-only (home-manager links ~/.config into it)
NIX_STORE = "/nix/store"


class UnsafeFile(Exception):
    """A file refused before any of it is read: outside its folder (through a symbolic
    link) to a file that is not proven the user's choice, not a regular file (a FIFO
    would block the read forever, a device never end), or larger than the bound. The
    message says which."""


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _linked_problem(real: str, st: os.stat_result, place: str) -> str | None:
    """Why the file at ``real`` (``st``: its fstat), reached through a link out of its
    folder, is not one the user put there by choice, or None. ``place`` is where the link
    stands, from its folder's name down (``harnesses/toy.toml``).

    GNU stow links each file of ~/.config into a package that mirrors it
    (``~/.dotfiles/mlx-kit/.config/mlx-kit/harnesses/toy.toml``), home-manager into
    /nix/store. So the file must be this user's and end in ``place`` (a link to
    ``~/.kube/config`` from a cloned spec repository does not, whatever its mode: under a
    home others cannot enter, a 0644 file is as private as a 0600 one), or be root's,
    inside :data:`NIX_STORE` (whose files every user may read); be changed by no one else,
    it and every folder above it (:func:`kit.owners.other_writers`; a sticky folder keeps
    our names ours); and not be in a place that holds keys or startup code
    (:func:`kit.harness.places.forbidden`: ``~/.ssh``, ``~/.bashrc``, mlx-kit's state)."""
    uid = os.geteuid()
    in_store = st.st_uid == 0 and _inside(real, NIX_STORE)
    if st.st_uid != uid and not in_store:
        return (f"which belongs to another user (uid {st.st_uid})" if st.st_uid != 0
                else f"which belongs to root, outside {NIX_STORE}")
    if who := other_writers(st, real):
        return f"which {who} may change (mode {stat.S_IMODE(st.st_mode):04o})"
    if why := forbidden(Path(real)):
        return f"where no agent's file may come from: {why}"
    for folder in Path(real).parents:
        try:
            fst = os.stat(folder)
        except OSError as e:
            return f"in {folder}, which cannot be checked ({e.strerror})"
        if fst.st_uid not in (uid, 0):
            return f"in {folder}, which belongs to another user (uid {fst.st_uid})"
        if (who := other_writers(fst, folder)) and not fst.st_mode & stat.S_ISVTX:
            return f"in {folder}, which {who} may write (they could swap the file)"
    if not in_store and not real.endswith(os.sep + place):
        return (f"which is not kept at {place} of a dotfiles tree, as a stow or "
                "home-manager link's file is: mlx-kit copies no other file of yours into "
                "an agent's config")
    return None


def read_inside(root: Path, path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a file of the folder ``root`` (``root`` itself may be a
    link, as GNU stow makes one), at most ``limit`` bytes. A symbolic link that leaves
    ``root`` is followed only to a file the user chose (:func:`_linked_problem`: theirs
    at the same place of a mirror tree, or a /nix/store file; changed by no one else, not
    in a place that holds keys), as stow and home-manager link each file of ~/.config.
    :class:`UnsafeFile`'s message does not name ``path``: the caller says which file it
    was.

    A user's spec or template may come from anywhere (a repository cloned into the config
    folder); a link in it to ``~/.ssh/id_ed25519`` or another user's file must not copy
    that into an agent's config file.

    Raises:
        FileNotFoundError: no such file.
        UnsafeFile: a link out of ``root`` to a file not proven the user's choice, not a
            regular file, or over ``limit`` bytes.
        OSError: it cannot be read.
    """
    real, home = os.path.realpath(path), os.path.realpath(root)
    # where the link stands, spelt from the folder's own name: what a mirror tree repeats
    place = os.path.join(os.path.basename(os.path.abspath(root)),
                         os.path.relpath(os.path.abspath(path), os.path.abspath(root)))
    linked = None
    if not _inside(real, home):
        # judged before it is opened (no device is opened, no secret touched), then again
        # on the open file: what is read is what was judged
        linked = os.lstat(real)
        if not stat.S_ISREG(linked.st_mode):
            raise UnsafeFile(f"links to {real}, outside {root}, which is not a regular file")
        if why := _linked_problem(real, linked, place):
            raise UnsafeFile(f"links to {real}, outside {root}, {why}")
    # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: a link swapped in
    # since realpath looked is refused (ELOOP)
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if linked is not None and ((st.st_dev, st.st_ino) != (linked.st_dev, linked.st_ino)
                                   or _linked_problem(real, st, place)):
            raise UnsafeFile(f"links to {real}, outside {root}, which changed as it was read")
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile("not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"larger than {limit // 1024} KiB")
    return data
