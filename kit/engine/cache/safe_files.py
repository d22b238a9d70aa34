"""Files in a folder of ours opened without following symlinks, for the prompt cache's
disk tier (:mod:`kit.engine.cache.disk_cache`): a symlink planted in the cache folder must
never make us read, write or delete a file outside it; the test of whether a folder is
one only this user can write (:func:`not_private`); and whether a folder is on a
filesystem that keeps no owners or modes (:func:`modeless_fs`: exFAT, FAT, NTFS drives),
where that test cannot be passed and the MAC alone proves a file ours."""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import sys
from pathlib import Path
from typing import Any

from kit.owners import other_writers, users_own_group  # noqa: F401 (its old home)

#: Filesystems that store no POSIX owner or mode: every file shows the mount's owner and
#: one fixed mode (often 0777), and chmod fails or does nothing. Linux's vfat, msdos,
#: exfat and ntfs3 drivers, FUSE's exFAT and NTFS drivers (both "fuseblk"; ntfs-3g's
#: "permissions" option keeps modes, which only makes us trust less than we could), and
#: macOS's msdos, exfat and ntfs.
MODELESS = frozenset({"vfat", "msdos", "exfat", "ntfs", "ntfs3", "fuseblk"})
_MOUNTINFO_MAX = 4 << 20  #: bytes of /proc/self/mountinfo read (thousands of mounts)
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


def _unescape(field: str) -> str:
    """A mountinfo path field: the kernel writes space, tab, newline and backslash as
    octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_type(mountinfo: str, path: str) -> str | None:
    """The filesystem type of the mount that holds ``path`` (absolute, no links) in
    ``mountinfo`` (the text of ``/proc/self/mountinfo``): the longest mount point above
    it, the last one listed when several share it (a later mount hides an earlier)."""
    best, kind = -1, None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split(" ")
        if not sep or len(fields) < 5 or not right:
            continue
        point = _unescape(fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, kind = len(point), right.split(" ", 1)[0]
    return kind


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem that holds ``path`` (or, when it does not exist yet,
    its nearest folder that does): Linux's ``/proc/self/mountinfo``, macOS's
    ``statfs`` (through ctypes; not exercised on Linux's CI); None where it cannot be
    told, which keeps every check as strict as on a POSIX filesystem."""
    real = Path(os.path.realpath(path))
    while not real.exists() and real != real.parent:
        real = real.parent
    try:
        if sys.platform == "darwin":
            return _darwin_fs_type(str(real))
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            return mount_type(f.read(_MOUNTINFO_MAX), str(real))
    except (OSError, ValueError, AttributeError):
        return None


def _darwin_fs_type(path: str) -> str | None:
    """``f_fstypename`` of macOS's ``statfs(2)`` (64-bit-inode layout: ``statfs$INODE64``
    on x86_64, ``statfs`` on arm64), read from a buffer larger than the struct."""
    import ctypes

    class StatFs(ctypes.Structure):
        _fields_ = [("f_bsize", ctypes.c_uint32), ("f_iosize", ctypes.c_int32),
                    ("f_counts", ctypes.c_uint64 * 5), ("f_fsid", ctypes.c_int32 * 2),
                    ("f_owner", ctypes.c_uint32), ("f_type", ctypes.c_uint32),
                    ("f_flags", ctypes.c_uint32), ("f_fssubtype", ctypes.c_uint32),
                    ("f_fstypename", ctypes.c_char * 16)]

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        call = getattr(libc, "statfs$INODE64")
    except AttributeError:
        call = libc.statfs
    buf = ctypes.create_string_buffer(8192)  # the struct is 2168 bytes: room to spare
    if call(os.fsencode(path), buf) != 0:
        return None
    return StatFs.from_buffer(buf).f_fstypename.decode("ascii", "replace") or None


def modeless_fs(path: Path) -> str | None:
    """The type of the filesystem ``path`` is on when it is one of :data:`MODELESS`
    (no owners or modes to check), else None (:func:`filesystem_type`)."""
    kind = filesystem_type(path)
    return kind if kind in MODELESS else None


def not_private(folder: Path, modeless_ok: bool = False) -> str | None:
    """Why files in ``folder`` could have been written by another user, as ssh's
    StrictModes judges it; None when they cannot. ``folder`` (if it exists) must be a
    folder of this user that neither group nor others may write; every folder above it,
    along the path as given and as resolved, must belong to this user or root and be
    writable by no one else unless it is sticky (as /tmp is: there others cannot rename
    or delete what is ours), and no name on the path as given may be a link of another
    user's (fs.protected_symlinks is off on some Linux systems and absent on macOS). A
    folder that does not exist yet is ours to create (0700).
    Group write is harmless when the group is this user's private one (as Debian's ssh
    allows it: :func:`kit.owners.users_own_group`), so a umask of 002 does not refuse a folder.

    With ``modeless_ok``, a folder on a filesystem that keeps no modes
    (:func:`modeless_fs`) is judged by its owner alone (the mount's: this user's, or
    root's above ``folder``); its mode bits say nothing. For the prompt cache's folder,
    whose files must then pass the MAC on a private copy, never for the key's.
    """
    uid = os.geteuid()
    given = Path(os.path.abspath(folder))
    for d in (given, *given.parents):  # as spelt: a link of theirs chose where it leads
        try:
            link = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISLNK(link.st_mode) and link.st_uid not in (uid, 0):
            return f"{d} is a link of another user's (uid {link.st_uid}): they chose " \
                   "where it leads"
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
        who = other_writers(st, d)  # a user-private group (umask 002) is no one else
        if who and (itself or not st.st_mode & stat.S_ISVTX) and \
                not (modeless_ok and modeless_fs(d)):
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
