"""Review finding (issue 25, log file): another user who can change the names in the log's
folder, or in the folder above it, must not be able to stop the engine.

Before, with ``--log-file`` in a sticky folder of another user's (its owner may rename
and delete any name in it), or in a private folder of ours under a folder everyone may
write (they rename our folder away and make their own in its place), that user put a
file of theirs at the log's path: the engine process's handler (the stdlib's
WatchedFileHandler) saw the path change, closed our file, failed to open theirs (it is
not ours: right) and raised out of the logging call, so the engine exited with 1, and so
did every engine started after it: the server said ``failed`` until restarted. Now a
folder of another user's is refused at start, and the engine keeps writing to the file
it has (or, starting, to stderr) when the path is no longer a file of ours."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kit.logfile import LOG_FILE_ENV, EngineLogFile, setup_engine
from tests.helpers import clean_env, flat, free_port, run_kit, wait_health

NOBODY = 65534
as_nobody = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                               reason="needs root and setpriv to act as nobody")
MODEL = "mlx-kit/SmolLM2-135M-Instruct"


def _nobody(script: str) -> None:
    subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                    "sh", "-c", script], check=True, timeout=30)


@as_nobody
def test_a_log_folder_of_another_user_is_refused_even_when_sticky(tmp_path):
    # (nobody need not reach it: its owner's rights are what is judged)
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chown(folder, NOBODY, NOBODY)
    folder.chmod(0o1777)
    r = run_kit(tmp_path, "serve", "--port", str(free_port()), "--log-file",
                str(folder / "mlx.log"), "--model", "/nonexistent", timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"error: refusing the log file {folder / 'mlx.log'}: {folder} belongs to " \
           f"another user (uid {NOBODY})" in flat(r.stderr)
    assert not (folder / "mlx.log").exists()


@as_nobody
def test_the_engines_handler_keeps_its_file_when_another_users_file_takes_the_path(
        sticky_box, monkeypatch, capsys):
    top = sticky_box / "open"
    top.mkdir()
    top.chmod(0o777)  # everyone may write: they may rename our folder in it
    ours = top / "me"
    ours.mkdir(mode=0o700)
    path = ours / "mlx.log"
    handler = EngineLogFile(path)
    log = logging.getLogger("test.engine.swapped")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("before")
        _nobody(f"mv {ours} {top}/old && mkdir -m 777 {ours} && echo theirs > {path}")
        log.warning("after")  # before: PermissionError out of this call
        log.warning("and after")
    finally:
        log.removeHandler(handler)
        handler.close()
    assert (top / "old" / "mlx.log").read_text() == "before\nafter\nand after\n"
    assert path.read_text() == "theirs\n"
    assert "Logging error" not in capsys.readouterr().err
    # an engine started now (the server restarts one) logs to stderr instead of exiting
    monkeypatch.setenv(LOG_FILE_ENV, str(path))
    try:
        setup_engine(logging.INFO)
        assert [type(h) for h in logging.getLogger().handlers] == [logging.StreamHandler]
    finally:
        logging.basicConfig(force=True, handlers=[logging.StreamHandler()])
    assert f"the engine process logs to stderr: cannot open the log file {path}" \
        in capsys.readouterr().err
    assert path.read_text() == "theirs\n"


@pytest.mark.model
@as_nobody
def test_a_server_whose_log_folder_another_user_swaps_keeps_answering(hf_home, tmp_path,
                                                                      sticky_box):
    top = sticky_box / "open"
    top.mkdir()
    top.chmod(0o777)
    ours = top / "me"
    ours.mkdir(mode=0o700)
    path = ours / "mlx.log"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                             "--log-file", str(path), "--model", MODEL],
                            env=clean_env(tmp_path / "home", hf_home),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = f"http://127.0.0.1:{port}"

    def ask() -> int:
        return httpx.post(root + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}).status_code

    try:
        wait_health(root, proc, timeout=180)
        assert ask() == 200
        _nobody(f"mv {ours} {top}/old && mkdir -m 777 {ours} && echo theirs > {path}")
        assert [ask() for _ in range(3)] == [200, 200, 200]  # before: 503s, then failed
        health = httpx.get(root + "/health", timeout=10).json()
        assert (health["status"], health["restarts"]) == ("ok", 0), health
    finally:
        proc.terminate()
        proc.wait(30)
    assert path.read_text() == "theirs\n"
    assert "exited unexpectedly" not in (top / "old" / "mlx.log").read_text()


@as_nobody
def test_a_folder_on_the_log_path_that_is_another_users_link_is_refused(tmp_path,
                                                                        sticky_box):
    # before: `--log-file /tmp/logs/mlx.log` with /tmp/logs a link of theirs (Linux with
    # fs.protected_symlinks=0, or macOS) put the log in a folder of ours they chose
    chosen = tmp_path / "chosen-by-them"
    chosen.mkdir(mode=0o700)
    _nobody(f"ln -s {chosen} {sticky_box}/logs")
    log = sticky_box / "logs" / "mlx.log"
    r = run_kit(tmp_path, "serve", "--port", str(free_port()), "--log-file", str(log),
                "--model", "/nonexistent", timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"error: refusing the log file {log}: {sticky_box / 'logs'} is a link of " \
           f"another user's (uid {NOBODY})" in flat(r.stderr)
    assert list(chosen.iterdir()) == []
    # a link of the user's own on the way is followed as before
    mine = tmp_path / "mine"
    mine.symlink_to(chosen)
    r = run_kit(tmp_path, "serve", "--port", str(free_port()), "--log-file",
                str(mine / "mlx.log"), "--model", "/nonexistent", timeout=60)
    assert "refusing the log file" not in flat(r.stderr), r.stderr
    assert [p.name for p in chosen.iterdir()] == ["mlx.log"]
