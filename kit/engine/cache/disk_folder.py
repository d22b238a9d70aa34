"""What is on disk under a :class:`kit.engine.cache.disk_cache.DiskCache`'s root: its
identity folders and files, the index of their headers, and deletes. Every rule of the
layout (see :mod:`kit.engine.cache.disk_cache`) that decides what is ours lives here: only
names of our shapes, in real (not symlinked) folders, owned by this user and not writable
by others, are ever read or deleted; another user's file gets one warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kit.engine.cache.cache_identity import FORMAT
from kit.engine.cache.safe_files import (
    header_metadata as _header_metadata,
    open_file as _open_file,
    real_dir as _real_dir,
)

log = logging.getLogger("mlx_kit.engine")

_FOLDER = re.compile(r"^[0-9a-f]{32}$")
_FILE = re.compile(r"^([0-9a-f]{64})\.safetensors$")
_TMP = re.compile(r"^[0-9a-f]{64}\.(\d+)\.tmp$")
_STALE_TMP_S = 3600.0  # a tmp whose writer's pid was reused: stale after an hour anyway


@dataclass
class Entry:
    """One file on disk: its path, the tokens its cache holds, its layers' cache class
    names (read from the safetensors header, not the tensors) and its size in bytes."""

    path: Path
    tokens: np.ndarray
    classes: tuple[str, ...]
    size: int


class DiskFolder:
    """The on-disk side of :class:`kit.engine.cache.disk_cache.DiskCache` (a mixin: the
    cache sets ``root``, ``bytes``, ``entries``, ``_index`` and ``_refused`` in its
    ``__init__``). Paths are under ``root``; sizes in bytes; OSErrors other than a file
    that vanished propagate unless a method says otherwise."""

    root: Path
    bytes: int
    entries: int
    _index: dict[str, dict[str, Entry]]  # identity -> file name -> Entry
    _refused: set[tuple[str, int, int]]  # (path, inode, mtime): warned about once
    modeless: str | None  # a filesystem without modes: a file is judged by its owner only

    def _ours(self) -> list[Path]:
        """Our identity folders under root."""
        try:
            return [Path(e.path) for e in os.scandir(self.root)
                    if e.is_dir(follow_symlinks=False) and _FOLDER.match(e.name)]
        except FileNotFoundError:
            return []

    def _scan(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every file of ours; sets bytes/entries."""
        files = []
        for folder in self._ours():
            for e in os.scandir(folder):
                if _FILE.match(e.name) and e.is_file(follow_symlinks=False):
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if st.st_uid != os.geteuid():  # another user's: not ours to evict
                        continue
                    files.append((st.st_mtime, st.st_size, Path(e.path)))
        self.bytes, self.entries = sum(f[1] for f in files), len(files)
        return files

    def _remove_stale_tmp(self) -> None:
        """Delete our ``.tmp`` files whose writer is gone (a crash mid-write)."""
        import psutil

        for folder in self._ours():
            for e in os.scandir(folder):
                m = _TMP.match(e.name)
                if not m or int(m.group(1)) == os.getpid() or \
                        not e.is_file(follow_symlinks=False):  # links: not ours, left alone
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_uid != os.geteuid():  # another user's tmp: not ours to delete
                    continue
                old = time.time() - st.st_mtime > _STALE_TMP_S
                if old or not psutil.pid_exists(int(m.group(1))):
                    Path(e.path).unlink(missing_ok=True)
                    log.info("removed an unfinished prompt cache file %s", e.path)

    def _refresh(self, identity: str) -> dict[str, Entry]:
        """The index of ``identity``'s folder, brought up to date with what is on disk
        (files another server wrote or evicted): new files' headers are read (not their
        tensors); a header that does not parse or match is deleted with a warning."""
        folder = self.root / identity
        entries = self._index.setdefault(identity, {})
        try:
            # a symlinked identity folder is not ours: never read or delete through it
            names = {e.name for e in os.scandir(folder)
                     if _FILE.match(e.name) and e.is_file(follow_symlinks=False)} \
                if _real_dir(folder) else set()
        except FileNotFoundError:
            names = set()
        for gone in set(entries) - names:
            del entries[gone]
        for name in names - set(entries):
            path = folder / name
            try:
                with _open_file(path) as f:
                    if self._foreign(path, os.fstat(f.fileno())):
                        continue
                    meta = _header_metadata(f)
                if meta.get("0.format") != FORMAT or meta.get("0.model") != identity:
                    raise ValueError("another format or model")
                tokens = np.asarray(json.loads(meta["0.tokens"]), dtype=np.int32)
                if _FILE.match(name).group(1) != hashlib.sha256(tokens.tobytes()).hexdigest():
                    raise ValueError("its name is not its tokens' hash")
                layers = sorted((int(k[2:]), v) for k, v in meta.items()
                                if re.fullmatch(r"1\.\d+", k))
                entries[name] = Entry(path, tokens, tuple(v for _, v in layers),
                                      path.lstat().st_size)
            except FileNotFoundError:
                continue
            except Exception as e:  # truncated, corrupt, foreign: a miss, and it goes
                self._discard(identity, path, f"unreadable header ({e})")
        return entries

    def _foreign(self, path: Path, st: os.stat_result) -> bool:
        """Whether ``path`` (``st``: its fstat) is another user's or others can write it
        (never read or deleted; one warning per file version). On a filesystem without
        modes (:attr:`modeless`) every file shows the same mode: only its owner (the
        mount's) counts, and the MAC decides."""
        if st.st_uid == os.geteuid() and (self.modeless or not st.st_mode & 0o022):
            return False
        seen = (str(path), st.st_ino, st.st_mtime_ns)
        if seen not in self._refused:
            self._refused.add(seen)
            whose = "another user's" if st.st_uid != os.geteuid() else "writable by others"
            log.warning("refusing prompt cache file %s: it is %s (uid %d, mode %04o), not "
                        "proven this user's", path, whose, st.st_uid, st.st_mode & 0o7777)
        return True

    def _discard(self, identity: str, path: Path, why: str) -> None:
        log.warning("deleting prompt cache file %s: %s", path, why)
        self._delete(identity, path)
        self._scan()

    def _delete(self, identity: str, path: Path) -> None:
        """Delete our file ``path``: only a regular file in a real (not symlinked) folder
        of ours; a link is left alone."""
        self._index.get(identity, {}).pop(path.name, None)
        try:
            st = path.lstat()
            if not _real_dir(path.parent) or not stat.S_ISREG(st.st_mode) or \
                    st.st_uid != os.geteuid():  # a link or another user's: not ours
                return
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot delete prompt cache file %s: %s", path, e)
