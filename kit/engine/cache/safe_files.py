"""Files in a folder of ours opened without following symlinks, for the prompt cache's
disk tier (:mod:`kit.engine.cache.disk_cache`): a symlink planted in the cache folder must
never make us read, write or delete a file outside it; and the test of whether a folder
is one only this user can write (:func:`not_private`)."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

from kit.owners import other_writers, users_own_group  # noqa: F401 (its old home)

HEADER_MAX = 64 << 20  #: a safetensors header over this is not ours (128k tokens: ~1 MiB)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  #: POSIX; without it open_file checks islink


def real_dir(path: Path) -> bool:
    """Whether ``path`` is a folder itself, not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def open_file(path: Path) -> Any:
    """``path`` opened for reading (binary) without following a symlink; a file object
    named ``path`` (mx.load picks the format from the name).

    Raises:
        OSError: it cannot be opened, is a link (ELOOP) or is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or \
                (not NOFOLLOW and os.path.islink(path)):
            raise OSError(f"{path} is not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    f.raw.name = str(path)
    return f


def raw_header(f: Any) -> bytes:
    """The JSON header of the safetensors file open in ``f`` (read from its start: an
    8-byte little-endian length, then that much JSON), its bytes as they are on disk.

    Raises:
        ValueError: not a safetensors header (or one over :data:`HEADER_MAX` bytes).
    """
    f.seek(0)
    head = f.read(8)
    if len(head) != 8:
        raise ValueError("no safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > HEADER_MAX:
        raise ValueError(f"a {n}-byte header")
    body = f.read(n)
    if len(body) != n:
        raise ValueError("a truncated header")
    return body


def header_metadata(f: Any) -> dict[str, str]:
    """The ``__metadata__`` of the safetensors file open in ``f``, from its header only
    (:func:`raw_header`), checked against the file's size. Our own few lines because
    safetensors' ``safe_open`` takes only a path, and a path would follow a symlink.

    Raises:
        ValueError: not a safetensors header (or one over :data:`HEADER_MAX` bytes).
    """
    body = raw_header(f)
    header = json.loads(body)
    # the tensors must end where the file does (safe_open checks this too): a file cut
    # short by a crash or a full disk is not a cache
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
              default=0)
    if 8 + len(body) + end != os.fstat(f.fileno()).st_size:
        raise ValueError("its tensors do not end with the file (truncated?)")
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("its metadata is not strings")
    return meta


def not_private(folder: Path) -> str | None:
    """Why files in ``folder`` could have been written by another user, as ssh's
    StrictModes judges it; None when they cannot. ``folder`` (if it exists) must be a
    folder of this user that neither group nor others may write; every folder above it,
    along the path as given and as resolved, must belong to this user or root and be
    writable by no one else unless it is sticky (as /tmp is: there others cannot rename
    or delete what is ours). A folder that does not exist yet is ours to create (0700).
    Group write is harmless when the group is this user's private one (as Debian's ssh
    allows it: :func:`kit.owners.users_own_group`), so a umask of 002 does not refuse a folder.
    """
    uid = os.geteuid()
    given = Path(os.path.abspath(folder))
    real = given.resolve()
    chain = list(dict.fromkeys([real, *real.parents, given, *given.parents]))
    for d in chain:
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{d} cannot be checked ({e.strerror})"
        itself = d in (given, real)
        if not stat.S_ISDIR(st.st_mode):
            return f"{d} is not a folder"
        if st.st_uid != uid and (itself or st.st_uid != 0):
            return f"{d} belongs to another user (uid {st.st_uid})"
        who = other_writers(st)  # a user-private group (umask 002) is no one else
        if who and (itself or not st.st_mode & stat.S_ISVTX):
            return f"{d} is writable by {who} (mode {st.st_mode & 0o7777:04o})"
    return None


def fsync_dir(folder: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
