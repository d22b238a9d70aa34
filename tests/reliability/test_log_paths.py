"""Issue 25 item 4: the log file gets and gives only what is this user's. Another local
user who can write in the log's folder (a shared /tmp) plants a file of theirs, or a link
to a file of ours, where `serve --log-file` will write; or replaces the file after a
rotation, where `mlx-kit logs -f` will read. Real files and real `python -m kit serve`
processes (which stop at the log check: no model needed); "another user" is `nobody`,
whose files only root can make, so those tests need root."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from kit.logfile import check_rotation_targets
from kit.logread import Follower
from tests.helpers import flat, free_port, run_kit, wait_until
from tests.test_logs import Followed

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can make nobody's files")


def _shared(tmp_path: Path) -> Path:
    """A folder every user may write in, sticky, as /tmp is."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def _serve_with_log(home: Path, log: Path):
    return run_kit(home, "serve", "--port", str(free_port()), "--log-file", str(log),
                   "--model", "/nonexistent", timeout=60)


@as_root
def test_a_log_file_another_user_planted_is_refused_and_gets_no_log(tmp_path):
    # before: an empty file counted as ours, and the server's log (prompts, paths) went
    # into a file the other user owns and reads
    planted = _shared(tmp_path) / "mlx.log"
    planted.write_bytes(b"")
    os.chown(planted, NOBODY, NOBODY)
    planted.chmod(0o666)
    r = _serve_with_log(tmp_path, planted)
    assert r.returncode == 1, r.stderr
    assert f"error: refusing the log file {planted}: another user owns {planted}" \
        in flat(r.stderr)
    assert planted.read_bytes() == b"" and "Traceback" not in r.stderr


@as_root
def test_another_users_link_at_the_log_path_is_not_followed(tmp_path):
    # before: `resolve()` followed the link, and the (empty, so "ours") target of ours it
    # named got the log appended
    victim = tmp_path / "mine.txt"
    victim.write_bytes(b"")
    link = _shared(tmp_path) / "mlx.log"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    r = _serve_with_log(tmp_path, link)
    assert r.returncode == 1, r.stderr
    assert f"another user owns {link}" in flat(r.stderr)
    assert victim.read_bytes() == b""


@as_root
def test_a_rotation_name_another_user_planted_is_refused(tmp_path):
    shared = _shared(tmp_path)
    planted = shared / "mlx.log.2"
    planted.write_bytes(b"")
    os.chown(planted, NOBODY, NOBODY)
    r = _serve_with_log(tmp_path, shared / "mlx.log")
    assert r.returncode == 1 and f"another user owns {planted}" in flat(r.stderr)
    assert not (shared / "mlx.log").exists()


def test_a_log_file_in_a_folder_everyone_may_write_without_the_sticky_bit_is_refused(
        tmp_path):
    # there, anyone may rename our log away and put theirs in its place
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    r = _serve_with_log(tmp_path, folder / "mlx.log")
    assert r.returncode == 1, r.stderr
    assert f"every user may write in {folder}" in flat(r.stderr)
    assert not (folder / "mlx.log").exists()


def test_a_fifo_where_the_rotation_goes_is_refused_without_a_hang(tmp_path):
    # before: sniffing whether it was one of our logs opened it, which waits for a writer
    path = tmp_path / "mlx.log"
    os.mkfifo(tmp_path / "mlx.log.1")
    r = _serve_with_log(tmp_path, path)
    assert r.returncode == 1, r.stderr
    assert "would overwrite or delete files that are not mlx-kit logs: " \
           f"{tmp_path / 'mlx.log.1'}" in flat(r.stderr)
    with pytest.raises(Exception, match="not mlx-kit logs"):
        check_rotation_targets(path)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "mlx.log.1").st_mode)


@as_root
def test_logs_follow_never_shows_a_file_another_user_put_at_the_log_path(tmp_path):
    # the server rotates (renames its log); another user creates the path first, with
    # lines of their own: `logs -f` shows none of them, then the server's new file
    path = tmp_path / "server.log"
    path.write_bytes(b"ours 1\n")
    followed = Followed(Follower(path, start=0))
    try:
        wait_until(lambda: followed.text() == "ours 1\n", timeout=30, what="ours 1")
        path.rename(tmp_path / "server.log.1")
        # made nobody's before it takes the path (as root it would be "ours" meanwhile)
        planted = tmp_path / "planted"
        planted.write_bytes(b"2026-12-02 06:00:00,000 ERROR mlx_kit.serve: fake\n")
        os.chown(planted, NOBODY, NOBODY)
        planted.rename(path)
        time.sleep(0.5)  # 50 polls: the planted file stays unread
        assert "fake" not in followed.text()
        path.unlink()
        path.write_bytes(b"ours 2\n")
        wait_until(lambda: followed.text() == "ours 1\nours 2\n", timeout=30, what="ours 2")
    finally:
        followed.end()

