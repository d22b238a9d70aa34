"""The background server's pid file, what it proves, and ``stop``: the stop side of
:mod:`kit.daemon` (which re-exports every public name here; callers may import either).

``serve`` writes ``server-<port>.json`` (pid, start time, command line, url, model, log,
admin token; 0600) in the state dir; ``stop`` signals only a process that file proves is
ours (see :func:`stop_server`), and only on a loopback URL (:func:`is_loopback`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from kit.errors import ServerError
from kit.harness.files import atomic_write
from kit.paths import log_dir, state_dir
from kit.probe import probe
from kit.urls import ServerURL


def pid_file(url: ServerURL) -> Path:
    """The pid file of the server at ``url``'s port: ``server-<port>.json`` in the state
    dir (it may not exist)."""
    return state_dir() / f"server-{url.port}.json"


def log_file(url: ServerURL) -> Path:
    """The log of the detached server at ``url``'s port: ``server-<port>.log`` in the log
    dir (it may not exist)."""
    return log_dir() / f"server-{url.port}.log"


def write_pid_file(url: ServerURL, model: str, log: Path | None, admin_token: str) -> Path:
    """Record this process as the server for ``url`` (called by ``serve``): its pid, start
    time and command line (so ``stop`` can prove a pid is still this server, not a program
    that got the number later) and the admin token. Written atomically, readable by this
    user only (0600)."""
    path = pid_file(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    text = json.dumps({"pid": me.pid, "create_time": me.create_time(),
                       "cmdline": me.cmdline(), "url": url.root, "model": model,
                       "log": str(log) if log else None, "started": time.time(),
                       "admin_token": admin_token})
    atomic_write(path, text, mode=0o600)
    return path


def remove_pid_file(url: ServerURL) -> None:
    """Remove the pid file if it names this process (called by ``serve`` on exit)."""
    info = read_pid_file(url)
    if info and info.get("pid") == os.getpid():
        pid_file(url).unlink(missing_ok=True)


def read_pid_file(url: ServerURL) -> dict | None:
    """The pid file's content (see :func:`write_pid_file`), or None when it is absent or
    not JSON."""
    try:
        return json.loads(pid_file(url).read_text())
    except (OSError, ValueError):
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost``, 127.0.0.0/8,
    ::1). Only those are provably this machine: any other address may be a container, a VM
    or another host whose pid numbers mean nothing here."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_serve_command(cmdline: list[str]) -> bool:
    """Whether a command line is ``mlx-kit serve`` / ``python -m kit serve``."""
    return "serve" in cmdline and any("kit" in c for c in cmdline[:3])


def _process_matches(info: dict) -> psutil.Process | None:
    """The process the pid file ``info`` names, if it is still that process: same pid, the
    start time and command line recorded when it wrote the file (a pid the system has
    since given to another program, or another user's process, is not), and that command
    line is an mlx-kit server's. Else None."""
    try:
        pid, started, cmdline = int(info["pid"]), float(info["create_time"]), info["cmdline"]
        proc = psutil.Process(pid)
        if (abs(proc.create_time() - started) < 0.01 and proc.cmdline() == cmdline
                and _is_serve_command(cmdline)):
            return proc
    except (KeyError, TypeError, ValueError, psutil.Error):
        pass
    return None


@dataclass(frozen=True)
class Owned:
    """A server at a URL that this user's pid file proves is ours.

    Attributes:
        info: the pid file's content (pid, admin_token, log, ...).
        process: the server process, when it provably is the pid file's process (the pid's
            start time and command line match the file and ``/health`` reports that pid);
            None when only the admin token can reach it.
    """

    info: dict
    process: psutil.Process | None


def owned_server(url: ServerURL) -> Owned | None:
    """The server at ``url`` if this user's state dir proves it is ours, else None
    (nothing answers and the pid file is stale or absent).

    Raises:
        ServerError: something answers but we cannot prove it is ours (a non-loopback URL,
            no pid file of this user/HOME for that port, something that is not mlx-kit), or
            the pid file names a live server that does not answer; the message says which.
    """
    if not is_loopback(url.host):
        raise ServerError(f"not stopping {url.root}: it is not a loopback address, so a pid "
                          "it reports means nothing on this machine",
                          hint="stop it on the machine (or in the container) that runs it")
    info = read_pid_file(url)
    p = probe(url)
    if p.kind == "other":
        raise ServerError(f"{url.root} is not an mlx-kit server ({p.detail}); not stopping it")
    proc = _process_matches(info) if info else None
    if p.kind == "none":
        if proc is not None:  # ours, alive, but no HTTP: we cannot confirm it is serving
            raise ServerError(f"the server process {proc.pid} named by {pid_file(url)} runs "
                              f"but nothing answers at {url.root}; not signalling it",
                              hint=f"if it is stuck, `kill {proc.pid}`; see {log_file(url)}")
        if info is not None:  # stale: the server died without removing it
            pid_file(url).unlink(missing_ok=True)
        return None
    if not info or not info.get("admin_token"):
        raise ServerError(f"not stopping the server at {url.root}: no pid file of this user "
                          f"in {state_dir()}, so it was started by another user or HOME",
                          hint="stop it from the session or account that started it")
    health_pid = p.health.pid if p.health else None
    if proc is not None and health_pid == proc.pid:
        return Owned(info, proc)
    if proc is not None:  # our server lives, but something else answers: keep the token
        raise ServerError(f"not stopping {url.root}: it reports pid {health_pid}, but the "
                          f"server {pid_file(url)} names is pid {proc.pid}",
                          hint="check what listens on that port (e.g. `ss -ltnp`)")
    return Owned(info, None)  # not provable here: only the admin token can tell


def _exited(proc: psutil.Process, timeout: float) -> bool:
    """Wait until ``proc`` ended: gone, or a zombie (it exited; its parent, e.g. the agent a
    launch became, has not reaped it, and ``psutil.wait`` would wait for that)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _gone(url: ServerURL, timeout: float) -> bool:
    """Wait until nothing answers at ``url`` (the server released its port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe(url, timeout=1.0).kind == "none":
            return True
        time.sleep(0.1)
    return False


def stop_server(url: ServerURL, timeout: float = 15.0) -> tuple[int | None, str] | None:
    """Stop the server at ``url`` if it is provably ours (see :func:`owned_server`).

    When the pid file, the process's start time and command line, and ``/health`` agree,
    it is sent SIGTERM (SIGKILL after ``timeout`` seconds); otherwise it is asked through
    the admin API (``POST /admin/shutdown`` with the pid file's token), which takes the same
    graceful path.

    Returns:
        ``(pid or None, "signal" | "admin API")``, or None if no mlx-kit server ran there
        (a stale pid file is removed).

    Raises:
        ServerError: not provably ours, or it refused or did not stop (the message says why).
    """
    owned = owned_server(url)
    if owned is None:
        return None
    if owned.process is not None:
        proc = owned.process
        try:
            proc.terminate()  # psutil refuses if the pid was reused since it was checked
            if not _exited(proc, timeout):
                proc.kill()
                if not _exited(proc, 5):
                    raise ServerError(f"the server (pid {proc.pid}) did not exit after SIGKILL")
        except psutil.NoSuchProcess:
            pass
        pid_file(url).unlink(missing_ok=True)
        return proc.pid, "signal"
    try:
        r = httpx.post(url.root + "/admin/shutdown", timeout=10,
                       headers={"Authorization": f"Bearer {owned.info['admin_token']}"})
    except httpx.HTTPError as e:
        raise ServerError(f"the server at {url.root} did not answer the shutdown: {e}") from None
    if r.status_code in (401, 403):
        stale = _process_matches(owned.info) is None  # else: that server lives elsewhere
        if stale:
            pid_file(url).unlink(missing_ok=True)
        raise ServerError(f"not stopping the server at {url.root}: it refused the admin token "
                          f"of {pid_file(url)} (HTTP {r.status_code}), so it is not the server "
                          "that file named" + ("; the stale file was removed" if stale else ""),
                          hint="stop it from the session or account that started it")
    if r.status_code != 200:
        raise ServerError(f"the server at {url.root} refused to shut down: HTTP {r.status_code}")
    try:
        pid = r.json().get("pid")
    except (ValueError, AttributeError):
        pid = None
    if not _gone(url, timeout):
        raise ServerError(f"the server at {url.root} accepted the shutdown but still answers "
                          f"after {timeout:.0f} s", hint=f"see {log_file(url)}")
    return pid, "admin API"
