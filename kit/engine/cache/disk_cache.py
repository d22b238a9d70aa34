"""The prompt cache's disk tier: KV caches of long prompt prefixes kept on disk, so a
restart, a swap away and back or a TTL reload does not pay the whole prefill again.

One job: store, find, load and evict (what is on disk, its index and deletes:
:mod:`kit.engine.cache.disk_folder`). Which cache a request starts from stays with
:class:`kit.engine.cache.policy.PromptCachePolicy`; when a write happens (idle time on the
engine worker) stays with :class:`kit.engine.decode.engine.Engine`.

Layout: ``<root>/<model identity>/<sha256 of the tokens>.safetensors``, each file written by
mlx-lm's ``save_prompt_cache`` (safetensors: the cache tensors plus string metadata, here
the token ids as JSON, the model identity, :data:`FORMAT` and the file's MAC under this
user's key, :mod:`kit.engine.cache.cache_mac`). A write goes to
``<name>.<pid>.tmp`` in the same folder, is fsynced and renamed into place, so a crash
mid-write leaves only a ``.tmp`` (removed at the next start once its writer is gone).
Only names of that shape, in folders named like an identity, are ever read or deleted:
anything else in the folder is left alone, symlinks included (never followed). Folders
we create are 0700 and files 0600: they hold the prompts' token ids.

Proven ours: a file is used only when it is this user's, nobody else can write it and
its MAC verifies (over the whole file, before its tensors load). Another user's file is
never read or deleted (one warning); one of ours that fails goes, as any that does not
load. A root that fails :func:`kit.engine.cache.safe_files.not_private` keeps the tier off.
On a filesystem that keeps no owners or modes (exFAT, FAT, NTFS drives:
:func:`kit.engine.cache.safe_files.modeless_fs`) the folder is judged by its owner (the
mount's) alone and every file by its MAC alone: each hit reads the file into memory and
checks the MAC on that copy, which is what loads (others may be able to write the file
meanwhile), and no hit skips the check.

The model identity (:func:`kit.engine.cache.cache_identity.model_identity`) hashes the model
folder, config.json's bytes, every file's name, size and mtime, the KV settings and
mlx-lm's and mlx's versions (taken when the model is loaded): a model whose files changed
gets a new folder, and its old entries are never loaded (they age out by LRU). Bounded:
after each write the least recently used files (mtime, touched on every
hit) are deleted until all of them fit ``max_bytes``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kit import mlx_lm_api
from kit.engine.cache import cache_mac
from kit.engine.cache.cache_identity import (
    FORMAT,
    classes_fit as _classes_fit,
    common_prefix,
    model_identity,
)
from kit.engine.cache.safe_files import (
    NOFOLLOW as _NOFOLLOW,
    fsync_dir as _fsync_dir,
    modeless_fs,
    not_private,
    open_file as _open_file,
    real_dir as _real_dir,
)
from kit.paths import private_dir
from kit.engine.cache.disk_folder import DiskFolder, Entry

log = logging.getLogger("mlx_kit.engine")

MIN_TOKENS = 256  #: shorter prompts are not worth a file (agent prefixes are 2k-20k)


@dataclass
class Found:
    """A stored entry that shares ``common`` leading tokens with a prompt."""

    entry: Entry
    common: int


class DiskCache(DiskFolder):
    """KV caches on disk under ``root``, at most ``max_bytes`` in all (see the module
    docstring). Used from the engine worker only (not thread-safe); several servers may
    share ``root`` (a file another one evicted is a miss).

    Args:
        root: the folder (created on the first write).
        max_bytes: bound on the files' total size, bytes (> 0).
        key: the MAC key (default: :func:`kit.engine.cache.cache_mac.user_key`). Without one
            (it cannot be read or made) or when ``root`` is not private, nothing is read
            or written (a warning).

    Attributes:
        writes: files written since start.
        bytes, entries: what the files under ``root`` held at the last scan (start, and
            after each write or delete).
    """

    def __init__(self, root: Path, max_bytes: int, key: bytes | None = None) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.writes = 0
        self.bytes = self.entries = 0
        self._index: dict[str, dict[str, Entry]] = {}  # identity -> file name -> Entry
        #: file name -> :func:`_unchanged` of the file when its MAC last passed: a file
        #: unchanged since is not hashed again (1.6 s/GB here) on every hit
        self._verified: dict[str, tuple[int, ...]] = {}
        self._identity_for: tuple[Any, str, str] | None = None  # (model ref, path, id)
        self._refused: set[tuple[str, int, int]] = set()  # (path, inode, mtime): logged
        self.key = key
        #: the filesystem's type when it keeps no owners or modes (then the MAC alone,
        #: on a copy in memory, proves a file ours), else None
        self.modeless: str | None = None
        try:
            problem = not_private(self.root, modeless_ok=True)
            if problem:
                raise OSError(f"not a private folder: {problem}")
            self.key = key or cache_mac.user_key()
        except OSError as e:
            self.key = None
            log.warning("the prompt cache's disk tier is off: %s", e)
            return
        self.modeless = modeless_fs(self.root)
        if self.modeless:  # the user's own drive, but its modes say nothing: say so once
            log.warning("the prompt cache folder %s is on a filesystem (%s) that keeps no "
                        "owners or modes: other local users may be able to write in it, so "
                        "each file is used only when its MAC verifies, checked on a copy "
                        "in memory at every hit", self.root, self.modeless)
        try:
            self._remove_stale_tmp()
            self._scan()
        except OSError as e:
            log.warning("prompt cache folder %s: %s", self.root, e)

    # -- identity --------------------------------------------------------------------------

    def identity(self, slot: Any) -> str | None:
        """:func:`model_identity` of the model loaded in ``slot`` (a ModelSlot), computed
        once per loaded model object; None when nothing is loaded or the folder cannot be
        read (then the disk tier sits this model out)."""
        model = slot.model
        if model is None:
            return None
        path = str(slot.info.path)
        known = self._identity_for
        # a weak reference: the old model must not outlive its release because of us
        if known is not None and known[0]() is model and known[1] == path:
            return known[2]
        try:
            ident = model_identity(slot.info.path, getattr(slot, "kv_bits", None),
                                   getattr(slot, "kv_group_size", 64))
        except OSError as e:
            log.warning("no disk prompt cache for %s: %s", slot.info.id, e)
            return None
        self._identity_for = (weakref.ref(model), path, ident)
        return ident

    # -- find / load -----------------------------------------------------------------------

    def find(self, identity: str, prompt: list[int], classes: tuple[str, ...],
             trimmable: bool) -> Found | None:
        """The stored entry of ``identity`` sharing the longest prefix with ``prompt``
        (at least :data:`MIN_TOKENS`), among those whose layers are ``classes``; an
        entry longer than the shared part counts only when ``trimmable``. None: none."""
        entries = self._refresh(identity) if self.key else None
        if not entries:
            return None
        want = np.asarray(prompt, dtype=np.int32)
        best: Found | None = None
        for entry in entries.values():
            if not _classes_fit(entry.classes, classes):
                continue
            common = common_prefix(want, entry.tokens)
            if common < len(entry.tokens) and not trimmable:
                continue
            if common >= MIN_TOKENS and (best is None or common > best.common):
                best = Found(entry, common)
        return best

    def load(self, identity: str, entry: Entry, classes: tuple[str, ...]) -> Any | None:
        """The cache stored in ``entry`` (its tensors read now), or None: the file is gone
        (another server evicted it), is not this user's (left alone, one warning), or
        its MAC fails, it does not load or does not match (layer count, ``classes``,
        every layer's offset == its token count), in which case it is deleted with one
        warning. A hit marks the file as just used (mtime)."""
        import mlx.core as mx
        try:
            with _open_file(entry.path) as f:  # never through a link
                st = os.fstat(f.fileno())
                if self._foreign(entry.path, st):
                    self._index.get(identity, {}).pop(entry.path.name, None)
                    return None
                # ours and nobody else can write it: what is checked is what loads. A
                # file that passed here before and has not changed since (same inode,
                # size, mtime and ctime: any write moves ctime, which no one but root
                # can set back) is not hashed again
                # Where others may write it (no modes), one copy in memory is checked
                # and loaded, and always checked.
                src = self._copy(f, st) if self.modeless else f
                if self.modeless or self._verified.get(entry.path.name) != _unchanged(st):
                    cache_mac.check(src, self.key)
                src.seek(0)
                cache, meta = mlx_lm_api.load_prompt_cache(src, return_metadata=True)
            mx.eval([c.state for c in cache])  # a bad tensor fails here, not mid-request
            names = tuple(type(c).__name__ for c in cache)
            if meta.get("tokens") != json.dumps(entry.tokens.tolist()) or \
                    not _classes_fit(names, classes):
                raise ValueError("its layers or tokens do not match the model")
            n = len(entry.tokens)
            if any(getattr(c, "offset", n) != n for c in cache):
                raise ValueError(f"a layer's offset is not its {n} tokens")
        except FileNotFoundError:
            self._index.get(identity, {}).pop(entry.path.name, None)
            return None
        except cache_mac.MacError as e:  # ours by its owner, not by its key
            self._verified.pop(entry.path.name, None)
            self._discard(identity, entry.path, f"not proven ours: {e}")
            return None
        except Exception as e:  # any failure to load is a miss, never the request's error
            self._verified.pop(entry.path.name, None)
            self._discard(identity, entry.path, f"cannot load it ({e})")
            return None
        try:
            os.utime(entry.path)  # least recently used goes first
            if not self.modeless:
                self._verified[entry.path.name] = _unchanged(entry.path.lstat())
        except OSError:
            self._verified.pop(entry.path.name, None)
        return cache

    def _copy(self, f: Any, st: os.stat_result) -> io.BytesIO:
        """The whole file open in ``f`` (``st``: its fstat) in memory, named as the file
        (mx.load picks the format from the name).

        Raises:
            ValueError: it is larger than the folder's bound, or changed as it was read.
        """
        if st.st_size > self.max_bytes:
            raise ValueError(f"it is larger than the folder's bound ({self.max_bytes} bytes)")
        f.seek(0)
        data = f.read(st.st_size + 1)
        if len(data) != st.st_size:
            raise ValueError("it changed as it was read")
        copy = io.BytesIO(data)
        copy.name = f.name
        return copy

    # -- write / evict ---------------------------------------------------------------------

    def save(self, identity: str, tokens: list[int], cache: Any, trimmable: bool) -> bool:
        """Write ``cache`` (holding ``tokens``) for ``identity``, atomically; then drop the
        entries whose tokens it extends (``trimmable``: a longer cache serves them) and
        evict the least recently used until the folder fits ``max_bytes``. Returns whether
        a file was written (not when one for the same tokens exists or the cache alone is
        over the bound). Errors (a full disk) are logged, never raised."""
        if self.key is None or sum(c.nbytes for c in cache) > self.max_bytes:
            return False
        arr = np.asarray(tokens, dtype=np.int32)
        name = hashlib.sha256(arr.tobytes()).hexdigest()
        folder = self.root / identity
        final = folder / f"{name}.safetensors"
        if os.path.lexists(final):  # a link of that name is not ours either: leave it
            return False
        tmp = folder / f"{name}.{os.getpid()}.tmp"
        meta = {"tokens": json.dumps(arr.tolist()), "model": identity, "format": FORMAT,
                cache_mac.TAG_FIELD: cache_mac.UNSEALED}
        made = False
        try:
            self._make_folder(self.root)  # 0700: files hold prompts' tokens
            self._make_folder(folder)
            # another user may have made it first (a folder in /tmp): then it is theirs
            problem = not_private(folder, modeless_ok=self.modeless is not None)
            if problem or not _real_dir(folder):  # a link in our folder is never followed
                raise OSError(problem or f"{folder} is not a folder of ours (a symlink?)")
            # O_EXCL|O_NOFOLLOW: never write through a link; 0600 whatever the umask
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
            made = True
            if not self.modeless:  # where there are no modes, chmod fails (EPERM)
                os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w+b") as f:
                mlx_lm_api.save_prompt_cache(f, cache, meta)
                f.flush()
                cache_mac.seal(f, self.key)  # before the rename: a file in place is sealed
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)  # replaces a name in a real folder; follows no link
            made = False
            _fsync_dir(folder)
        except OSError as e:
            log.warning("cannot write a prompt cache to %s: %s", folder, e)
            return False
        finally:  # any failure (not only OSError) must not leave our tmp behind
            if made:
                tmp.unlink(missing_ok=True)
        self.writes += 1
        entries = self._index.setdefault(identity, {})
        entries[final.name] = Entry(final, arr, tuple(type(c).__name__ for c in cache),
                                    final.lstat().st_size)
        if trimmable:
            for other in list(entries.values()):
                if len(other.tokens) < len(arr) and common_prefix(arr, other.tokens) == \
                        len(other.tokens):
                    self._delete(identity, other.path)
        self.evict()
        return True

    def _make_folder(self, path: Path) -> None:
        """Create ``path`` 0700 if missing (:func:`kit.paths.private_dir`); on a
        filesystem without modes, without the chmod (it fails with EPERM there)."""
        if self.modeless:
            path.mkdir(parents=True, exist_ok=True)
        else:
            private_dir(path)

    def evict(self) -> None:
        """Delete the least recently used files (any identity) until the rest fit
        ``max_bytes``; refresh :attr:`bytes` / :attr:`entries`."""
        files = self._scan()
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            self._delete(path.parent.name, path)
            total -= size
        self._scan()


def _unchanged(st: os.stat_result) -> tuple[int, ...]:
    """What tells a file apart from any later version of it: device, inode, size, and
    mtime and ctime in ns."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
