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

from tests.helpers import start_server, stop

pytestmark = pytest.mark.model

#: what the log must not say after a clean stop: an error, the engine "dying", a new
#: engine or a model load
_NOT_AFTER_STOP = ("ERROR", "exited unexpectedly", "starting a new engine process",
                   "loading", "loaded", "Traceback")


def _stopped_cleanly(server, sig: int, timeout: float = 60) -> None:
    """Send ``sig`` to ``server``'s process group and assert a clean stop."""
    family = psutil.Process(server.proc.pid).children(recursive=True)
    assert family, "the server started no engine process"
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
        hf_home, tmp_path):
    # mlx.launch runs in a session of its own: the group signal reaches the server (and
    # nothing of the world), which stops every rank through rank 0
    from tests.distributed.conftest import COMMON, RANK_FLAGS, ready

    server = ready(start_server(tmp_path, hf_home, *COMMON, *RANK_FLAGS, new_session=True))
    try:
        assert len(server.health()["distributed"]["ranks"]) == 3
        _stopped_cleanly(server, signal.SIGTERM, timeout=90)
    finally:
        stop(server)
