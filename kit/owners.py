"""Who besides this user may change a file or a folder: the mode and owner rules that the
log file (:mod:`kit.logpaths`), the prompt cache's folder
(:mod:`kit.engine.cache.safe_files`) and the files the user's specs link to
(:mod:`kit.harness.files`) share, so they judge "only mine" the same way.

Group write is harmless when the group is this user's private one (the user's primary
group, named as the user, with no other member: umask 002 on Debian and Ubuntu), as
Debian's ssh StrictModes allows it; any other group's write bit counts as another user's.
"""

from __future__ import annotations

import errno
import functools
import os
import stat


@functools.lru_cache(maxsize=16)
def users_own_group(gid: int) -> bool:
    """Whether the group ``gid`` is this user's private group: the user's primary group,
    named as the user, no other member and no other user's primary group. Cached per gid
    (``pwd.getpwall`` lists every user, which takes seconds on a large directory)."""
    try:
        import grp
        import pwd

        me = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    if gid != me.pw_gid or group.gr_name != me.pw_name or \
            any(m != me.pw_name for m in group.gr_mem):
        return False
    return not any(p.pw_gid == gid and p.pw_uid != me.pw_uid for p in pwd.getpwall())


def _has_acl(where: str | os.PathLike | int) -> bool:
    """Whether the file or folder ``where`` (a path, or an open descriptor) has a POSIX
    access ACL beyond its mode bits (Linux's ``system.posix_acl_access``); "cannot
    tell" counts as yes, a system or filesystem without them as no."""
    getxattr = getattr(os, "getxattr", None)
    if getxattr is None:
        return False
    try:
        getxattr(where, "system.posix_acl_access")
    except OSError as e:
        return e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)
    return True


def other_writers(st: os.stat_result, where: str | os.PathLike | int | None = None
                  ) -> str | None:
    """Who besides its owner may write the file or folder ``st`` describes (for a folder:
    create, rename and delete names in it): ``"its group"``, ``"others"``, ``"group and
    others"``, or None. Write by this user's private group (:func:`users_own_group`) is
    no one else's, unless the file has an ACL (``where``: its path or descriptor): then
    the group bits are the ACL's mask, and a write bit there is what the ACL grants to
    other users or groups (``setfacl -m u:them:rwx``, or a shared tree's default ACL)."""
    writable = st.st_mode & 0o022
    if writable & 0o020 and users_own_group(st.st_gid) and \
            (where is None or not _has_acl(where)):
        writable &= ~0o020
    if not writable:
        return None
    return "group and others" if writable == 0o022 else (
        "its group" if writable & 0o020 else "others")


def shared_folder(folder: str | os.PathLike) -> str | None:
    """Why another user (not root) may create, rename or delete names in ``folder``, or
    None: it belongs to another user, or its group or others may write it (sticky or not:
    the sticky bit keeps our names ours, not the names we have not made yet). A folder
    that does not exist or cannot be looked at is None: the caller's own open fails.
    """
    try:
        st = os.stat(folder)
    except OSError:
        return None
    if st.st_uid not in (os.geteuid(), 0):
        return f"{folder} belongs to another user (uid {st.st_uid})"
    who = other_writers(st, folder)
    if who:
        return f"{folder} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None
