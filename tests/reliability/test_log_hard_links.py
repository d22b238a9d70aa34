"""Review finding (issue 25, log file): a hard link another user puts at the log path.

A hard link has no owner of its own: it is the file it names. On macOS (no
fs.protected_hardlinks) and on Linux with fs.protected_hardlinks=0, another local user
may make, in a shared /tmp, ``/tmp/mlx.log`` a second name of any file of the victim's
they can reach (an empty one, or one with a line that looks like ours). Before, that file
passed every check (a regular file of this user's, "one of our logs"), the server's log
was appended to it and, at 40 MiB, it was emptied in place: the victim's own file lost
its bytes. Now a log file with another name is refused at start (a clean error) and at
every open (the race after the check, the engine's reopen, ``launch``'s). The links are
made by this test's user: a link's maker leaves no trace on it, so this is what another
user's link is."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kit import logfile
from kit.errors import ConfigError
from kit.logfile import EngineLogFile, ServerLogFile, open_private
from tests.helpers import flat, free_port, run_kit

MINE = b"2025-01-01 10:00:00,000 INFO myapp: started\nmy own notes, not a log of mlx-kit's\n"


def _shared(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


@pytest.mark.parametrize("content", [b"", MINE], ids=["empty", "log-like"])
def test_a_hard_link_at_the_log_path_to_a_file_of_ours_is_refused_and_left_unchanged(
        tmp_path, content):
    victim = tmp_path / "notes.txt"
    victim.write_bytes(content)
    link = _shared(tmp_path) / "mlx.log"
    os.link(victim, link)
    r = run_kit(tmp_path, "serve", "--port", str(free_port()), "--log-file", str(link),
                "--model", "/nonexistent", timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"error: refusing the log file {link}: it has other names (hard links)" \
        in flat(r.stderr)
    assert "Traceback" not in r.stderr and "unexpected error" not in r.stderr
    assert victim.read_bytes() == content


def test_a_hard_link_made_after_the_check_gets_no_line_and_is_never_emptied(
        tmp_path, monkeypatch):
    # the race: the path was free when checked, and is a second name of the victim's
    # file when the handler opens it
    victim = tmp_path / "notes.txt"
    victim.write_bytes(MINE)
    link = _shared(tmp_path) / "mlx.log"
    checked = logfile.check_rotation_targets

    def check_then_link(path: Path) -> None:
        checked(path)
        os.link(victim, path)

    monkeypatch.setattr(logfile, "check_rotation_targets", check_then_link)
    with pytest.raises(ConfigError, match=r"cannot open the log file .*2 names"):
        logfile.setup_server("info", link)
    for opener in (ServerLogFile, EngineLogFile, open_private):
        with pytest.raises(OSError, match="2 names"):
            opener(link)
    logging.basicConfig(force=True, handlers=[logging.StreamHandler()])
    assert victim.read_bytes() == MINE


@pytest.mark.parametrize("name", ["afile/x.log", "n" * 300 + ".log"],
                         ids=["not-a-dir", "too-long"])
def test_a_log_file_that_cannot_be_opened_is_a_clean_error_not_a_crash(tmp_path, name):
    # before: "unexpected error: NotADirectoryError" / "OSError: File name too long" and a
    # crash-*.log (the open was outside every check)
    (tmp_path / "afile").write_bytes(b"")
    r = run_kit(tmp_path, "serve", "--port", str(free_port()), "--log-file",
                str(tmp_path / name), "--model", "/nonexistent", timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"error: cannot open the log file {tmp_path / name}: " in flat(r.stderr)
    assert "unexpected error" not in r.stderr
