"""The prompt cache's folder on a filesystem that keeps no owners or modes (review
finding): an exFAT, FAT or NTFS drive shows every file as the mount's owner's with one
fixed mode (often 0777) and refuses chmod, so the StrictModes test refused every cache
folder on an external drive. Now a folder there that belongs to this user (the mount's
owner) is used, and each file is trusted by its MAC alone, checked on a copy in memory at
every hit; a folder another user owns or can write on a POSIX filesystem is still refused.

Mounting exFAT needs root and a block device, which this machine cannot give a test, so
the tests that stand for such a mount replace the one function that tells the filesystem
(``safe_files.filesystem_type``) and say so; their folders are given 0777 modes, as such a
mount shows them. The POSIX refusal and the detection on this machine are real.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path

import pytest

mx = pytest.importorskip("mlx.core")

from kit import mlx_lm_api
from kit.engine.cache import cache_mac, safe_files
from kit.engine.cache.disk_cache import DiskCache
from kit.engine.cache.safe_files import (
    MODELESS,
    filesystem_type,
    modeless_fs,
    mount_type,
    not_private,
)
from kit.errors import ConfigError
from tests.engine.test_disk_cache import (
    IDENT,
    LAYERS,
    kv_cache,
    mint,
    tokens,
    user_state,  # noqa: F401 (autouse fixture)
)
from tests.helpers import flat, free_port, needs_proc, run_kit

NOBODY = 65534

MOUNTINFO = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 8:17 / /media/me/My\040Drive rw,nosuid,nodev shared:2 - exfat /dev/sdb1 rw,uid=1000,fmask=0000
41 22 8:33 / /media/me/My\040Drive2 rw - vfat /dev/sdc1 rw,uid=1000
42 40 0:50 / /media/me/My\040Drive/inner rw - tmpfs tmpfs rw
43 22 8:49 / /media/me/My\040Drive rw - ext4 /dev/sdd1 rw
"""


def test_mount_type_finds_the_mount_that_holds_a_path():
    table = MOUNTINFO.replace("43 22", "#43")  # without the last line's mount over it
    table = "\n".join(line for line in table.splitlines() if not line.startswith("#"))
    assert mount_type(table, "/media/me/My Drive/cache") == "exfat"
    assert mount_type(table, "/media/me/My Drive") == "exfat"
    assert mount_type(table, "/media/me/My Drive2/cache") == "vfat"  # not "My Drive"'s
    assert mount_type(table, "/media/me/My Drive/inner/x") == "tmpfs"
    assert mount_type(table, "/home/me") == "ext4"
    # a later mount on the same point hides the earlier one
    assert mount_type(MOUNTINFO, "/media/me/My Drive/cache") == "ext4"


def test_this_machines_folders_are_on_filesystems_that_keep_modes(tmp_path):
    # the real detection: the test folders here are ext4/overlay/tmpfs, never loosened
    needs_proc("/proc/self/mountinfo")
    assert filesystem_type(tmp_path) not in (None, *MODELESS)
    assert modeless_fs(tmp_path) is None and modeless_fs(tmp_path / "not" / "yet") is None


def test_a_folder_others_can_write_on_a_posix_filesystem_is_still_refused(tmp_path):
    # real: the serve process's own check, with nothing replaced
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert "is writable by" in not_private(shared, modeless_ok=True)
    r = run_kit(tmp_path, "serve", "--port", str(free_port()), "--prompt-cache-dir",
                str(shared), "--model", "/nonexistent", timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"refusing --prompt-cache-dir {shared}: {shared} is writable by" in flat(r.stderr)


@pytest.fixture
def drive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder standing in for an exFAT drive mounted for this user: the filesystem
    detection replaced (see the module docstring) to say "exfat" under it, and its mode
    0777, as such a mount shows every folder and file."""
    root = tmp_path / "drive"
    root.mkdir()
    root.chmod(0o777)
    real = safe_files.filesystem_type

    def fake(path: Path) -> str | None:
        inside = os.path.realpath(path).startswith(str(root) + os.sep) or \
            os.path.realpath(path) == str(root)
        return "exfat" if inside else real(path)

    monkeypatch.setattr(safe_files, "filesystem_type", fake)
    return root


def _name(toks: list[int]) -> str:
    """A file's name in the cache: the sha256 of its tokens (int32)."""
    import hashlib

    import numpy as np

    return hashlib.sha256(np.asarray(toks, dtype=np.int32).tobytes()).hexdigest()


def _as_the_drive_shows_it(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(0o777)


def test_a_folder_of_this_user_on_an_exfat_drive_is_used_and_says_so(drive, caplog):
    from kit.cli.options import check_cache_dir

    cache = drive / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    assert not_private(cache, modeless_ok=True) is None
    check_cache_dir(str(cache), 1 << 30)  # serve's check: no refusal
    # the key's folder is never loosened: on such a drive others could read the key
    assert "is writable by" in not_private(cache)
    with caplog.at_level(logging.WARNING, "mlx_kit.engine"):
        disk = DiskCache(cache, 1 << 30)
    assert disk.key is not None and disk.modeless == "exfat"
    assert f"the prompt cache folder {cache} is on a filesystem (exfat) that keeps no " \
           "owners or modes" in caplog.text


def test_on_an_exfat_drive_only_files_whose_mac_verifies_on_a_copy_are_used(
        drive, monkeypatch, caplog):
    cache = drive / "cache"
    # chmod there fails (EPERM) for any mode the drive cannot store, as Linux's exfat
    # driver does: the disk tier must not need it
    real_chmod, real_fchmod = os.chmod, os.fchmod

    def no_modes(real):
        def call(target, mode, *a, **k):
            inside = isinstance(target, int) or str(target).startswith(str(drive))
            if inside:
                raise PermissionError(1, "Operation not permitted", str(target))
            return real(target, mode, *a, **k)
        return call

    key = cache_mac.user_key()  # this user's, in the state dir (off the drive)
    monkeypatch.setattr(os, "chmod", no_modes(real_chmod))
    monkeypatch.setattr(os, "fchmod", no_modes(real_fchmod))
    disk = DiskCache(cache, 1 << 30, key=key)
    assert disk.save(IDENT, tokens(300), kv_cache(300, 2.0), trimmable=True), caplog.text
    monkeypatch.setattr(os, "chmod", real_chmod)
    monkeypatch.setattr(os, "fchmod", real_fchmod)
    # what another local user can put there: no MAC, or one under another key
    for start, their_key in ((7, None), (8, os.urandom(32))):
        mint(cache / IDENT / f"{_name(tokens(400, start))}.safetensors", kv_cache(400, 9.0),
             tokens(400, start), key=their_key)
    _as_the_drive_shows_it(cache)
    loaded_from, checks = [], []
    real_load, real_check = mlx_lm_api.load_prompt_cache, cache_mac.check
    monkeypatch.setattr(mlx_lm_api, "load_prompt_cache",
                        lambda f, **k: (loaded_from.append(f), real_load(f, **k))[1])
    monkeypatch.setattr(cache_mac, "check",
                        lambda f, key: (checks.append(f), real_check(f, key))[1])

    disk = DiskCache(cache, 1 << 30)
    found = disk.find(IDENT, tokens(310), LAYERS, trimmable=True)
    assert found is not None and found.common == 300
    assert [c.offset for c in disk.load(IDENT, found.entry, LAYERS)] == [300, 300]
    assert disk.load(IDENT, found.entry, LAYERS) is not None  # hashed again: no fast path
    assert len(checks) == 2 and all(isinstance(f, io.BytesIO) for f in checks)
    assert loaded_from == checks  # what loaded is the copy the MAC was checked on
    for start in (7, 8):
        planted = disk.find(IDENT, tokens(400, start), LAYERS, trimmable=True)
        assert disk.load(IDENT, planted.entry, LAYERS) is None
    assert caplog.text.count("not proven ours") == 2
    assert sorted(p.name for p in (cache / IDENT).iterdir()) == [found.entry.path.name]


@pytest.mark.skipif(os.geteuid() != 0, reason="a drive mounted for another user needs root")
def test_an_exfat_drive_mounted_for_another_user_is_refused(drive):
    # the mount's owner is every file's: a drive mounted with uid=nobody is theirs
    cache = drive / "cache"
    cache.mkdir()
    for p in (drive, cache):
        os.chown(p, NOBODY, NOBODY)
    assert not_private(cache, modeless_ok=True) == \
        f"{cache} belongs to another user (uid {NOBODY})"
    from kit.cli.options import check_cache_dir

    with pytest.raises(ConfigError, match="belongs to another user"):
        check_cache_dir(str(cache), 1 << 30)
