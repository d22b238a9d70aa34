"""Issue 25 item 4: the log file gets and gives only what is this user's. Another local
user who can write in the log's folder (a shared /tmp) plants a file of theirs, or a link
to a file of ours, where `serve --log-file` will write; or replaces the file after a
rotation, where `mlx-kit logs -f` will read. Real files and real `python -m kit serve`
processes (which stop at the log check: no model needed); "another user" is `nobody`,
whose files only root can make, so those tests need root."""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from kit.logfile import MAX_BYTES_ENV, ServerLogFile, check_rotation_targets
from kit.logread import Follower
from tests.helpers import flat, free_port, run_kit, wait_until
from tests.test_logs import Followed

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can make nobody's files")
as_nobody = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                               reason="needs root and setpriv to run a process as nobody")


def _nobody(script: str) -> None:
    """Run the shell ``script`` as another local user (nobody)."""
    subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                    "sh", "-c", script], check=True, timeout=30)


def _emit(handler: logging.Handler, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        handler.emit(logging.makeLogRecord({"msg": f"record {i:04d} " + "y" * 40}))


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
def test_a_rotation_name_another_user_planted_in_a_sticky_folder_is_left_alone(tmp_path):
    # before: refused at start, while the same name taken after start broke the
    # rotation; now a log in a folder others may write is never renamed, so the names
    # its rotation would have used are not looked at
    shared = _shared(tmp_path)
    planted = shared / "mlx.log.2"
    planted.write_bytes(b"")
    os.chown(planted, NOBODY, NOBODY)
    r = _serve_with_log(tmp_path, shared / "mlx.log")
    assert "refusing the log file" not in flat(r.stderr), r.stderr
    said = flat((shared / "mlx.log").read_text())
    # root's group is its own (kit.owners.users_own_group): then only "others" counts
    assert re.search(re.escape(f"the log file {shared / 'mlx.log'} is not rotated: {shared} "
                               "is writable by ") + r"(group and )?others \(mode 1777\)",
                     said), said
    assert planted.read_bytes() == b"" and planted.stat().st_uid == NOBODY
    assert sorted(p.name for p in shared.iterdir()) == ["mlx.log", "mlx.log.2"]


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


@as_root
def test_a_log_file_in_a_folder_its_group_may_write_without_the_sticky_bit_is_refused(
        tmp_path):
    # before: only "every user" counted; a group others are in may rename our log away too
    folder = tmp_path / "team"
    folder.mkdir()
    os.chown(folder, -1, NOBODY)  # nogroup: not this user's private group
    folder.chmod(0o770)
    r = _serve_with_log(tmp_path, folder / "mlx.log")
    assert r.returncode == 1, r.stderr
    assert f"every member of its group may write in {folder}" in flat(r.stderr)
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



# --- after start: names another user takes where the log rotates -------------------------

@as_nobody
def test_rotation_in_a_sticky_shared_folder_never_touches_names_another_user_took(
        sticky_box, tmp_path, monkeypatch, capsys):
    """Review finding: `--log-file /tmp/x.log` passed the checks (/tmp is sticky), then
    another user made x.log.1 (free at check time): the stdlib's rotation raised
    PermissionError on every record after that (it cannot delete their file there), and a
    link of theirs decided where a rename landed. The attacker here is `nobody`."""
    monkeypatch.setenv(MAX_BYTES_ENV, "512")
    victim = tmp_path / "mine.txt"
    victim.write_bytes(b"my own file\n")
    # before, with the stdlib's handler: their x.log.1 is deleted (root may) or makes
    # every record a PermissionError (a user may not)
    before = sticky_box / "stock.log"
    _nobody(f"echo theirs > {before}.1")
    stock = logging.handlers.RotatingFileHandler(before, maxBytes=512, backupCount=3)
    _emit(stock, 40)
    stock.close()
    assert Path(f"{before}.1").stat().st_uid != NOBODY or \
        "PermissionError" in capsys.readouterr().err
    capsys.readouterr()
    path = sticky_box / "mlx.log"
    handler = ServerLogFile(path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    assert re.fullmatch(re.escape(f"{sticky_box} is writable by ") +
                        r"(group and )?others \(mode 1777\)", handler.no_rotation)
    _nobody(f"echo theirs > {path}.1; ln -s {victim} {path}.2; mkdir {path}.3")
    try:
        _emit(handler, 400)  # ~20 KiB: the 2 KiB bound is met ~10 times
    finally:
        handler.close()
    assert "Logging error" not in capsys.readouterr().err
    text = path.read_text()
    assert text.splitlines()[-1].startswith("record 0399 ") and path.stat().st_size <= 2048
    assert "the log file was emptied at 2048 bytes: it is not rotated" in text
    assert (Path(f"{path}.1").read_text(), Path(f"{path}.1").stat().st_uid) == \
        ("theirs\n", NOBODY)
    assert os.readlink(f"{path}.2") == str(victim) and victim.read_bytes() == b"my own file\n"
    assert sorted(p.name for p in sticky_box.iterdir() if p.name.startswith("mlx")) == [
        "mlx.log", "mlx.log.1", "mlx.log.2", "mlx.log.3"]


@pytest.mark.parametrize("kind", ["notes", "fifo", "folder"])
def test_a_rotation_that_meets_a_name_not_ours_stops_rotating_and_keeps_it(
        tmp_path, monkeypatch, capsys, kind):
    # in a private folder too: a file the user put at x.log.2 after start (the start's
    # check could not see it) is not renamed over; the log says so once, the server goes
    # on logging, and the file is emptied in place at 4x the size from then on
    monkeypatch.setenv(MAX_BYTES_ENV, "1024")
    path = tmp_path / "mlx.log"
    handler = ServerLogFile(path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    in_the_way = Path(f"{path}.2")
    try:
        _emit(handler, 30)  # one rotation: x.log.1 exists, x.log.2 not yet
        assert Path(f"{path}.1").exists() and not in_the_way.exists()
        if kind == "notes":
            in_the_way.write_bytes(b"my notes\n")
        elif kind == "fifo":
            os.mkfifo(in_the_way)
        else:
            in_the_way.mkdir()
        _emit(handler, 20, start=30)  # the rotation onto it fails: said in the log
        why = f"cannot rotate it: {in_the_way}: in the way of the rotation, and not a log " \
              "of ours"
        assert f"the log file {path} is no longer rotated ({why}); it is emptied in place " \
               "at 4096 bytes instead" in path.read_text()
        _emit(handler, 400, start=50)
    finally:
        handler.close()
    assert "Logging error" not in capsys.readouterr().err
    text = path.read_text()
    assert f"the log file was emptied at 4096 bytes: it is not rotated ({why})" in text
    assert text.splitlines()[-1].startswith("record 0449 ") and path.stat().st_size <= 4096
    if kind == "notes":
        assert in_the_way.read_bytes() == b"my notes\n"
    else:
        assert (stat.S_ISFIFO if kind == "fifo" else stat.S_ISDIR)(in_the_way.lstat().st_mode)
