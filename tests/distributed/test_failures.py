"""A distributed server that loses a rank, is stopped, or is refused up front.

Every test here runs real processes: `mlx-kit serve --ranks 3` on the starter (3 ring ranks
on 127.0.0.1, started by mlx.launch), a real `kill -9` of one rank's pid as /health reports
it, the official OpenAI SDK streaming from it, and `mlx-kit stop` against a server started
detached exactly as `launch` starts one (kit.daemon.ensure_server with serve options).
Each test that breaks a world starts its own (a lost world is not restarted); every rank
of this machine is checked by pid (and start time, via psutil) to be gone afterwards.

Each server gets its own TMPDIR, so the control directory (mlx-kit-ranks-*) it makes can
be checked without seeing another test's (or another developer's) servers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil
import pytest

from tests.helpers import (Server, clean_env, free_port, openai_for, run_kit, spawn_server,
                           wait_health, wait_until)

READY_S = 180  # a 3-rank server takes ~15-30 s here (2 cores); slack for a busy machine
EXIT_S = 30  # how long a server may take to end after it lost a rank
# short enough to test, long enough that a step of the tiny model on 2 busy cores (ms; the
# starter's prefill steps took ~5 s while CI ran beside) does not pass for a hung rank
RANK_TIMEOUT_S = 8
#: the hidden rank_reap_s knob: a hung rank is ended this long after the others exited
REAP_S = 3


# --- helpers -------------------------------------------------------------------------------


def _tmpdir(home: Path) -> Path:
    tmp = home / "tmp"
    tmp.mkdir(exist_ok=True)
    return tmp


def _world(health: dict) -> dict:
    """/health's ``distributed``, once every rank reported its pid."""
    world = health.get("distributed") or {}
    ranks = world.get("ranks") or []
    return world if ranks and all(r.get("pid") for r in ranks) else {}


def start_world(home: Path, hf_home: Path, model: Path,
                *args: str) -> tuple[Server, list[psutil.Process]]:
    """``serve --model MODEL --ranks 3 --temperature 0 ARGS`` with its own TMPDIR; wait
    until /health is 200 and names every rank's pid. Returns the server and the processes
    to check are gone afterwards: mlx.launch (/health's engine_pid) and every rank.
    ``model``: the tiny random llama (conftest's ``tiny_world_model``): what these tests
    check is the world's processes, not its text."""
    server = spawn_server(home, hf_home, "--model", str(model), "--ranks", "3",
                          "--temperature", "0", *args, TMPDIR=str(_tmpdir(home)),
                          MLX_KIT_RANK_REAP_S=str(REAP_S))
    wait_health(server.root, server.proc, timeout=READY_S)
    def reported() -> dict | None:
        health = server.health()
        return health if _world(health) else None
    health = wait_until(reported, timeout=60, what="every rank's pid in /health")
    return server, processes(health)


def processes(health: dict) -> list[psutil.Process]:
    """mlx.launch and every rank that ``health`` names (psutil remembers each one's start
    time, so a pid reused later is not mistaken for the rank)."""
    pids = [health["engine_pid"], *(r["pid"] for r in health["distributed"]["ranks"])]
    return [psutil.Process(pid) for pid in pids]


def alive(procs: list[psutil.Process]) -> list[int]:
    """The pids of ``procs`` that still run (a zombie has exited: not counted)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def control_dirs(home: Path) -> list[Path]:
    return sorted(_tmpdir(home).glob("mlx-kit-ranks-*"))


def kill_leftovers(procs: list[psutil.Process], server: Server | None = None) -> None:
    """Teardown: SIGKILL what this test started and left running (by pid, checked by start
    time), so that a failed test does not leave ranks spinning on this shared machine."""
    for p in procs:
        try:
            if p.is_running():
                p.kill()
        except psutil.NoSuchProcess:
            pass
    if server is not None and server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(10)


def assert_world_ended(server: Server, procs: list[psutil.Process], rank: int) -> str:
    """The server exited 1 within EXIT_S, printing the error that names ``rank``, no rank
    is left, and its control directory is gone. Returns the log."""
    code = server.proc.wait(EXIT_S)
    log = server.log_text()
    assert code == 1, f"serve exited {code}, expected 1; log tail:\n{log[-3000:]}"
    why = f"rank {rank} on 127.0.0.1 was killed by signal 9"
    assert f"error: the distributed engine stopped: {why}" in " ".join(log.split()), log[-3000:]
    wait_until(lambda: not alive(procs), timeout=15, what="every rank to exit")
    assert control_dirs(server.home) == []
    return log


# --- a lost rank -----------------------------------------------------------------------------

def test_killed_follower_mid_stream_ends_the_stream_and_the_server_naming_rank_2(
        hf_home, tiny_world_model, tmp_path):
    server, procs = start_world(tmp_path, hf_home, tiny_world_model)
    try:
        client = openai_for(server)
        stream = client.chat.completions.create(
            model="local", stream=True, max_tokens=4000,  # the tiny model decodes fast
            messages=[{"role": "user", "content": "Tell me about Paris."}])
        chunks = iter(stream)
        first = next(chunks)  # the request is in flight (prefill or decode) on every rank
        assert first.choices[0].delta.role == "assistant"
        os.kill(procs[3].pid, signal.SIGKILL)  # rank 2 (procs: mlx.launch, rank 0, 1, 2)
        with pytest.raises(openai.APIError) as got:
            for _ in chunks:
                pass
        assert "rank 2 on 127.0.0.1 was killed by signal 9" in str(got.value.message)
        assert_world_ended(server, procs, 2)
    finally:
        kill_leftovers(procs, server)


def test_killed_follower_while_idle_ends_the_server_naming_it(hf_home, tiny_world_model, tmp_path):
    server, procs = start_world(tmp_path, hf_home, tiny_world_model)
    try:
        os.kill(procs[3].pid, signal.SIGKILL)  # rank 2; no request in flight
        assert_world_ended(server, procs, 2)
    finally:
        kill_leftovers(procs, server)


def test_killed_rank_0_ends_the_server_naming_rank_0(hf_home, tiny_world_model, tmp_path):
    server, procs = start_world(tmp_path, hf_home, tiny_world_model)
    try:
        os.kill(procs[1].pid, signal.SIGKILL)  # rank 0, the one the server talks to
        assert_world_ended(server, procs, 0)
    finally:
        kill_leftovers(procs, server)


def test_a_short_rank_timeout_lets_the_world_start_and_idle_and_ends_a_hung_one(
        hf_home, tiny_world_model, tmp_path):
    server, procs = start_world(tmp_path, hf_home, tiny_world_model, "--rank-timeout",
                                str(RANK_TIMEOUT_S))
    try:
        client = openai_for(server)

        def ask() -> str:
            return client.chat.completions.create(
                model="local", max_tokens=4,
                messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content
        assert ask()
        # Idle past --rank-timeout and the watchdog's next look (every timeout / 4): that
        # time passing ends nothing is what is tested (nothing to wait on but the clock).
        time.sleep(RANK_TIMEOUT_S * 1.25 + 1)
        assert server.proc.poll() is None
        assert ask()
        os.kill(procs[3].pid, signal.SIGSTOP)  # rank 2 hangs, its connections open
        # the others' watchdogs (every 2 s), then mlx.launch's group is ended (REAP_S
        # after the first exit, SIGKILL 5 s later: a stopped rank does not take SIGTERM)
        code = server.proc.wait(EXIT_S + RANK_TIMEOUT_S + REAP_S + 10)
        log = " ".join(server.log_text().split())
        assert code == 1, log[-3000:]
        assert re.search(r"rank [01] \(\S+\): no answer from the other ranks for \d+ s "
                         r"\(--rank-timeout\); ending", log)  # (checked every timeout / 4)
        assert ("error: the distributed engine stopped: rank 2 on 127.0.0.1 stopped "
                f"answering: the other ranks waited {RANK_TIMEOUT_S} s (--rank-timeout) and "
                "gave up") in log
        wait_until(lambda: not alive(procs), timeout=15, what="every rank to exit")
    finally:
        try:
            os.kill(procs[3].pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        kill_leftovers(procs, server)


def test_a_hung_rank_0_is_ended_and_named(hf_home, tiny_world_model, tmp_path):
    server, procs = start_world(tmp_path, hf_home, tiny_world_model, "--rank-timeout",
                                str(RANK_TIMEOUT_S))
    try:
        os.kill(procs[1].pid, signal.SIGSTOP)  # rank 0: its connection to us stays open
        code = server.proc.wait(EXIT_S + RANK_TIMEOUT_S + REAP_S + 10)
        log = " ".join(server.log_text().split())
        assert code == 1, log[-3000:]
        assert ("error: the distributed engine stopped: rank 0 on 127.0.0.1 stopped "
                f"answering: the other ranks waited {RANK_TIMEOUT_S} s (--rank-timeout) and "
                "gave up") in log
        wait_until(lambda: not alive(procs), timeout=15, what="every rank to exit")
        assert control_dirs(tmp_path) == []
    finally:
        try:
            os.kill(procs[1].pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        kill_leftovers(procs, server)


# --- stop ----------------------------------------------------------------------------------

def start_detached_world(home: Path, hf_home: Path, model: Path) -> tuple[str, dict]:
    """A 3-rank server started the way `mlx-kit launch` starts one (ensure_server ->
    start_detached with the serve options), in a subprocess with the throwaway HOME.
    Returns its URL and /health."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    code = ("import json, sys; from kit.daemon import ensure_server; "
            "from kit.urls import parse_url; "
            f"p, started = ensure_server(parse_url({url!r}), None, {READY_S}, "
            f"serve_args=['--ranks', '3', '--model', {str(model)!r}]); "
            "print(json.dumps(p.health.to_json()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(home, hf_home, TMPDIR=str(_tmpdir(home))),
                       timeout=READY_S + 30)
    assert r.returncode == 0, r.stderr
    health = json.loads(r.stdout)
    assert health["distributed"]["world_size"] == 3
    return url, health


def test_stop_ends_a_detached_3_rank_server_and_every_rank(hf_home, tiny_world_model, tmp_path):
    url, health = start_detached_world(tmp_path, hf_home, tiny_world_model)
    server = psutil.Process(health["pid"])
    procs = [server, *processes(health)]
    try:
        assert len(control_dirs(tmp_path)) == 1
        status = run_kit(tmp_path, "status", "--url", url)  # the world, one line per rank
        assert status.returncode == 0, status.stderr
        assert "world:   3 ranks (ring, tensor parallel)" in status.stdout
        for r in health["distributed"]["ranks"]:
            assert f"  rank {r['rank']}: {r['host']} (pid {r['pid']})" in status.stdout
        r = run_kit(clean_env(tmp_path, hf_home, TMPDIR=str(_tmpdir(tmp_path))), "stop",
                    "--url", url, cwd=tmp_path, timeout=60)
        assert r.returncode == 0, r.stderr
        assert f"stopped the server at {url} (pid {health['pid']}, via signal)" in r.stdout
        assert alive(procs) == []  # stop returns once the server exited: ranks first
        assert control_dirs(tmp_path) == []
        assert run_kit(tmp_path, "status", "--url", url).returncode == 3
    finally:
        kill_leftovers(procs)


def test_sigkill_of_the_http_server_makes_every_rank_exit_on_its_own(
        hf_home, tiny_world_model, tmp_path):
    url, health = start_detached_world(tmp_path, hf_home, tiny_world_model)
    server = psutil.Process(health["pid"])
    procs = processes(health)
    try:
        server.kill()
        # rank 0's connection closes; it tells the others at the next sync and all exit
        wait_until(lambda: not alive(procs), timeout=15, what="every rank to exit")
        assert control_dirs(tmp_path) == []  # its authkey does not outlive the world
    finally:
        kill_leftovers([server, *procs])


# --- refused up front ------------------------------------------------------------------------

def _no_rank_of(home: Path) -> list[int]:
    """Pids of processes still running with this HOME (a rank or mlx.launch would be)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get("HOME") == str(home):
                out.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return out


@pytest.mark.parametrize(("args", "message"), [
    (["--ranks", "2"], "num_attention_heads is 9, not divisible by 2 ranks"),
    (["--ranks", "3", "--pipeline"], "mlx-lm has no pipeline mode for model type 'llama'"),
])
def test_a_split_the_starter_cannot_make_is_refused_before_any_rank_starts(
        hf_home, tmp_path, args, message):
    r = run_kit(tmp_path, "serve", "--port", str(free_port()), *args, hf_home=hf_home,
                timeout=120)
    assert r.returncode == 1, r.stderr
    text = " ".join(r.stderr.split())
    assert f"error: {message}" in text, text
    assert "Traceback" not in r.stderr
    assert "starting 3 ranks" not in r.stderr and "starting 2 ranks" not in r.stderr
    assert _no_rank_of(tmp_path) == []


@pytest.mark.parametrize(("args", "message"), [
    (["--hosts", "10.255.255.1,127.0.0.1"],
     "rank 0 would run on 10.255.255.1, not on this machine"),
    (["--hosts", "a,b"], "--hosts a: the ring backend needs IP addresses, not host names"),
    (["--hostfile", "{missing}"], "--hostfile {missing}: No such file or directory"),
    (["--hostfile", "{not_json}"], "--hostfile {not_json}: not JSON"),
    (["--ranks", "3", "--backend", "foo"], "--backend 'foo': one of ring, jaccl, mpi, nccl"),
])
def test_a_world_that_cannot_start_is_refused_before_the_model_or_any_rank(
        tmp_path, args, message):
    names = {"missing": str(tmp_path / "missing.json"), "not_json": str(tmp_path / "h.txt")}
    (tmp_path / "h.txt").write_text("10.0.0.1 10.0.0.2\n")
    r = run_kit(tmp_path, "serve", "--port", str(free_port()),
                *(a.format(**names) for a in args), timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"error: {message.format(**names)}" in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr
    assert not (tmp_path / ".cache" / "huggingface").exists()  # refused before the model
    assert _no_rank_of(tmp_path) == []


def test_a_killed_mlx_launch_ends_its_orphaned_ranks_and_the_server(
        hf_home, tiny_world_model, tmp_path):
    # kill -9 of mlx.launch itself left every rank running under init and /health saying
    # ok; the server now ends the ranks left in mlx.launch's session and reports it
    server, procs = start_world(tmp_path, hf_home, tiny_world_model)
    try:
        launcher = server.health()["engine_pid"]
        os.kill(launcher, signal.SIGKILL)
        code = server.proc.wait(EXIT_S)
        log = " ".join(server.log_text().split())
        assert code == 1, log[-3000:]
        assert ("error: the distributed engine stopped: mlx.launch exited with code -9; its "
                "ranks were ended") in log
        wait_until(lambda: not alive(procs), timeout=15, what="every rank to exit")
    finally:
        kill_leftovers(procs, server)
