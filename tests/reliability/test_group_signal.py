"""Issue 25 item 4: a signal to the server's whole process group (what `timeout`,
systemd's control-group kill, `docker stop` of a shell entry point and a terminal's Ctrl-C
send) is a clean stop: the server, its engine process and every rank end, exit 0, and the
log says nothing went wrong and loads nothing after the signal. Real servers, each in a
session of its own so the test can signal its group and only its group."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.helpers import start_server, stop, wait_until

pytestmark = pytest.mark.model

#: what the log must not say after a clean stop: an error, the engine "dying", a new
#: engine or a model load
_NOT_AFTER_STOP = ("ERROR", "exited unexpectedly", "starting a new engine process",
                   "loading", "loaded", "Traceback")


def _stopped_cleanly(server, sig: int, timeout: float = 60) -> None:
    """Send ``sig`` to ``server``'s process group and assert a clean stop."""
    family = psutil.Process(server.proc.pid).children(recursive=True)
    assert family, "the server started no engine process"
    # serve logs "ready: ... (loaded in N s)" from a thread just after /health turns 200:
    # the signal is sent after it, so that the start's own line is not read as a reload
    wait_until(lambda: "ready: " in server.log_text(), 30, what="the ready line")
    before = len(server.log.read_bytes())
    os.killpg(server.proc.pid, sig)  # start_new_session: the group id is its pid
    assert server.proc.wait(timeout) == 0
    _, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, f"outlived the server: {[p.pid for p in alive]}"
    after = server.log.read_bytes()[before:].decode(errors="replace")
    said = [line for line in after.splitlines() if any(w in line for w in _NOT_AFTER_STOP)]
    assert not said, f"after {signal.Signals(sig).name}:\n" + "\n".join(said)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_group_stops_server_and_engine_without_an_error_or_a_reload(
        hf_home, tmp_path, sig):
    server = start_server(tmp_path, hf_home, new_session=True)
    try:
        _stopped_cleanly(server, sig)
    finally:
        stop(server)


def test_a_group_sigterm_stops_a_3_rank_world_and_every_rank_without_an_error(
        hf_home, tiny_world_model, tmp_path):
    # mlx.launch runs in a session of its own: the group signal reaches the server (and
    # nothing of the world), which stops every rank through rank 0 (the tiny random
    # llama: the processes, not the text, are checked)
    from tests.distributed.conftest import COMMON, RANK_FLAGS, ready

    server = ready(start_server(tmp_path, hf_home, *COMMON, *RANK_FLAGS, "--model",
                                str(tiny_world_model), new_session=True))
    try:
        assert len(server.health()["distributed"]["ranks"]) == 3
        _stopped_cleanly(server, signal.SIGTERM, timeout=90)
    finally:
        stop(server)


@pytest.mark.parametrize("how", ["SystemExit", "KeyboardInterrupt"])
def test_a_process_that_leaves_without_stopping_its_engine_does_not_hang(hf_home, tmp_path,
                                                                         how):
    # Regression: the engine ignores SIGTERM, and multiprocessing's exit hook SIGTERMs a
    # daemon child then joins it with no timeout: a server that left with its engine
    # still up (a Ctrl-C while it started, before uvicorn ran) hung forever. Its exit
    # hook now stops the engine through the pipe first.
    import subprocess
    import sys

    from tests.helpers import clean_env

    code = ("from huggingface_hub import snapshot_download\n"
            "from kit.engine.proc.process import EngineProcess\n"
            "from kit.models.resolve import resolve_model\n"
            "from kit.models.starter import STARTER_ID\n"
            "e = EngineProcess(resolve_model(snapshot_download(STARTER_ID, "
            "local_files_only=True)))\n"
            "e.start()\n"
            "assert e.wait_ready(120)\n"
            "print(e.pid, flush=True)\n"
            f"raise {how}()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=clean_env(tmp_path, hf_home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        proc.kill()
    engine = int(out.split()[0])
    assert not psutil.pid_exists(engine) or \
        psutil.Process(engine).status() == psutil.STATUS_ZOMBIE, "the engine outlived it"
    # SystemExit() exits 0; an uncaught KeyboardInterrupt dies of SIGINT, as Python does
    assert proc.returncode == (0 if how == "SystemExit" else -signal.SIGINT), err
