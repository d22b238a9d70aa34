"""Review finding (issue 25, "only mine"): a POSIX ACL that lets another user write.

kit.owners lets the group write bit pass when the group is the user's private one
(umask 002), as Debian's ssh StrictModes does. With an ACL the group bits are the ACL's
mask, not the group's rights: ``setfacl -m u:nobody:rwx`` on a 0755 folder makes it
0775, and a folder made in a tree with a default ACL (a shared project folder) gets
such entries by itself. Before, such a folder of the user's, in the user's private
group, counted as writable by no one else: a prompt cache folder, a log folder that is
rotated by renaming, and a dotfiles folder a spec links into were all trusted while
`nobody` could create and rename names in them. Needs Linux (ACLs as the
``system.posix_acl_access`` attribute); the write is proven by `nobody` doing it, which
needs root and setpriv."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kit.engine.cache.safe_files import not_private
from kit.errors import ConfigError
from kit.harness.files import UnsafeFile, read_inside
from kit.logpaths import check_log_path, rotates
from kit.owners import other_writers, users_own_group

NOBODY = 65534
pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux POSIX ACLs"),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                       reason="needs root and setpriv to write as nobody"),
    pytest.mark.skipif(not users_own_group(os.getegid()),
                       reason="needs this user's private group (umask 002's case)")]


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A ``system.posix_acl_access`` value (version 2; tag, perms, id per entry)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _let_nobody_write(folder: Path) -> None:
    """``setfacl -m u:nobody:rwx folder`` (the folder was 0755: now it shows 0775)."""
    any_id = 0xFFFFFFFF
    try:
        os.setxattr(folder, "system.posix_acl_access", _acl(
            (0x01, 7, any_id), (0x02, 7, NOBODY), (0x04, 5, any_id), (0x10, 7, any_id),
            (0x20, 5, any_id)))
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on this filesystem: {e}")


def _nobody_writes(folder: Path) -> bool:
    r = subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup",
                        "--clear-groups", "sh", "-c", f"echo theirs > {folder}/planted"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


@pytest.fixture
def shared(sticky_box: Path) -> Path:
    folder = sticky_box / "ours"
    folder.mkdir()
    folder.chmod(0o755)
    os.chown(folder, -1, os.getegid())  # the user's private group
    _let_nobody_write(folder)
    assert oct(folder.stat().st_mode & 0o777) == "0o775"
    return folder


def test_a_folder_an_acl_lets_another_user_write_is_not_only_ours(shared):
    assert _nobody_writes(shared)  # what every check below must see
    assert other_writers(os.stat(shared), shared) == "its group"
    assert not_private(shared) == f"{shared} is writable by its group (mode 0775)"
    assert rotates(shared / "mlx.log") == f"{shared} is writable by its group (mode 0775)"
    with pytest.raises(ConfigError, match="every member of its group may write in"):
        check_log_path(shared / "mlx.log")


def test_a_spec_linked_into_a_folder_an_acl_lets_another_user_write_is_refused(
        shared, tmp_path):
    (shared / "toy.toml").write_text('name = "toy"\n')
    (shared / "toy.toml").chmod(0o644)
    specs = tmp_path / "harnesses"
    specs.mkdir()
    (specs / "toy.toml").symlink_to(shared / "toy.toml")
    with pytest.raises(UnsafeFile, match=f"in {shared}, which its group may write"):
        read_inside(specs, specs / "toy.toml", 1 << 16)


def test_a_private_group_folder_without_an_acl_is_still_ours(sticky_box, tmp_path):
    # the non-attack side: umask 002's 0775 folder in the user's own group passes
    folder = sticky_box / "umask002"
    folder.mkdir()
    folder.chmod(0o775)
    os.chown(folder, -1, os.getegid())
    assert not _nobody_writes(folder)
    assert other_writers(os.stat(folder)) is None
    assert not_private(folder) is None and rotates(folder / "mlx.log") is None
    check_log_path(folder / "mlx.log")
