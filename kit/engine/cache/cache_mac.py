"""Prompt cache files proven ours: every file of the disk tier (:mod:`kit.engine.cache.disk_cache`)
carries an HMAC-SHA256 under a per-user key, checked before any of its KV is used. The
model identity in a file's header names files (paths, sizes, mtimes, versions) and is no
integrity check: without the MAC another local user who can put a file in the folder
could have a victim's prompt answered from KV computed for a prompt of theirs.

The key: 32 random bytes, as 64 hex digits, in ``<state dir>/prompt-cache.key``
(platformdirs' user state dir), mode 0600. It is created complete and atomically (a
private temporary file, then ``link``, which never replaces a file), so two servers
starting at once end up with the same key. A key file that is a symlink, not this user's,
readable or writable by group or others, or malformed may have been read or chosen by
someone else: it is replaced by a new key (a warning; caches sealed under the old one
become misses).

The tag: a file's safetensors metadata holds ``mac``, 64 hex digits (``"0.mac"`` in the
header, as mlx-lm's ``save_prompt_cache`` flattens it). It is
``HMAC-SHA256(key, DOMAIN + the file's bytes with those 64 digits read as "0"s)``, so it
covers the header (tokens, model identity, format, every tensor's dtype, shape and
offsets) and every tensor byte. A file is written with the 64 zeros in place, then
sealed (:func:`seal`) before it is renamed into place.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

from kit.engine.cache.safe_files import NOFOLLOW, not_private, raw_header
from kit.paths import private_dir, state_dir

log = logging.getLogger("mlx_kit.engine")

KEY_FILE = "prompt-cache.key"
TAG_FIELD = "mac"  #: the metadata key of the tag
UNSEALED = "0" * 64  #: the tag's value while a file is written, and in the MAC'd bytes
_DOMAIN = b"mlx-kit prompt cache 2\n"
_TAG = re.compile(rb'"0\.mac":"([0-9a-f]{64})"')
_CHUNK = 1 << 20


class MacError(ValueError):
    """A prompt cache file is not sealed under this user's key (unsealed, altered, or
    sealed under another key)."""


def user_key(folder: Path | None = None) -> bytes:
    """This user's prompt cache key (32 bytes) from ``folder`` (default: the state dir,
    created 0700 if missing), created on first use; see the module docstring.

    Raises:
        OSError: the folder is not private (:func:`kit.engine.cache.safe_files.not_private`) or
            the key cannot be read or written.
    """
    folder = private_dir(Path(folder) if folder else state_dir())
    problem = not_private(folder)
    if problem:
        raise OSError(f"the prompt cache key's folder is not private: {problem}")
    path = folder / KEY_FILE
    try:
        key, _ = _read_key(path)
    except FileNotFoundError:
        key = None
    if key is not None:  # the common case: no lock taken
        return key
    from filelock import FileLock

    # Creating or replacing the key under a lock: two servers that both found it bad
    # would otherwise each write one, and the first one's files would fail the second
    # one's MAC and be deleted as not ours
    with FileLock(str(folder / (KEY_FILE + ".lock")), timeout=30):
        for _ in range(3):
            try:
                key, why = _read_key(path)
            except FileNotFoundError:
                _write_key(path, replace=False)
                continue
            if key is not None:
                return key
            log.warning("replacing the prompt cache key %s: %s", path, why)
            _write_key(path, replace=True)
    raise OSError(f"cannot settle the prompt cache key {path}")


def _read_key(path: Path) -> tuple[bytes | None, str]:
    """(the key, "") or (None, why it cannot be trusted)."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        return None, f"it cannot be opened as a file ({e.strerror})"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (not NOFOLLOW and os.path.islink(path)):
            return None, "it is not a regular file"
        if st.st_uid != os.geteuid():
            return None, f"it belongs to another user (uid {st.st_uid})"
        if st.st_mode & 0o077:
            return None, f"its mode is {st.st_mode & 0o777:04o}, not 0600"
        text = f.read(200).strip()
    if not re.fullmatch(rb"[0-9a-f]{64}", text):
        return None, "it is not 64 hex digits"
    return bytes.fromhex(text.decode()), ""


def _write_key(path: Path, replace: bool) -> None:
    """A new key at ``path``: written whole to a private temporary file (O_EXCL, 0600),
    then linked into place (never over a file) or, with ``replace``, renamed over it."""
    tmp = path.with_name(f"{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:  # another server made it first: theirs is read next
                pass
    finally:
        tmp.unlink(missing_ok=True)


def _digest(f: Any, key: bytes, header: bytes, span: tuple[int, int]) -> bytes:
    """The tag of the file open in ``f`` (``header``: its raw header; ``span``: where the
    tag's digits are in it), reading the tensors from the header's end to the file's."""
    h = hmac.new(key, _DOMAIN, hashlib.sha256)
    h.update(len(header).to_bytes(8, "little"))
    h.update(header[:span[0]] + UNSEALED.encode() + header[span[1]:])
    f.seek(8 + len(header))
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):
        h.update(view[:n])
    return h.digest()


def _tag_span(header: bytes) -> tuple[int, int, str]:
    """(start, end, digits) of the one tag in ``header``.

    Raises:
        MacError: no tag, or more than one.
    """
    found = list(_TAG.finditer(header))
    if len(found) != 1:
        raise MacError("it carries no MAC" if not found else "it carries two MACs")
    m = found[0]
    return m.start(1), m.end(1), m.group(1).decode()


def seal(f: Any, key: bytes) -> None:
    """Write the tag of the file open in ``f`` (read and write, binary), written with
    ``mac`` = :data:`UNSEALED` in its metadata, in place of those zeros.

    Raises:
        ValueError: not such a file.
    """
    header = raw_header(f)
    start, end, digits = _tag_span(header)
    if digits != UNSEALED:
        raise ValueError("the file is sealed already")
    tag = _digest(f, key, header, (start, end)).hex()
    f.seek(8 + start)
    f.write(tag.encode())


def check(f: Any, key: bytes) -> None:
    """Prove the file open in ``f`` (binary, from a file of ours that nobody else can
    write: what is checked must be what is loaded) sealed under ``key``; costs one read
    of the whole file (``bench/cache_mac.py``: ms per GB).

    Raises:
        MacError: it is not (a miss, whatever else it holds).
        ValueError: not a safetensors file.
    """
    header = raw_header(f)
    start, end, digits = _tag_span(header)
    if not hmac.compare_digest(_digest(f, key, header, (start, end)).hex(), digits):
        raise MacError("its MAC does not verify under this user's key (sealed under "
                       "another key, or altered)")
