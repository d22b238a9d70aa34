"""Start, find and stop the background server: reuse it if it answers, else start one.

The detached server writes ``server-<port>.json`` (pid, start time, command line, url,
model, log, admin token; 0600) in the state dir and logs to ``server-<port>.log`` in the
log dir. ``stop`` signals only a process that file proves is ours (see :func:`stop_server`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
from filelock import FileLock
from filelock import Timeout as FileLockTimeout

from kit.errors import ModelDoesNotFitError, PortInUseError, ServerError, error_kind
from kit.harness.files import atomic_write
from kit.logfile import RUN_SEPARATOR, open_private
from kit.logread import last_lines
from kit.paths import log_dir, state_dir
from kit.probe import Probe, probe
from kit.urls import ServerURL


def pid_file(url: ServerURL) -> Path:
    return state_dir() / f"server-{url.port}.json"


def log_file(url: ServerURL) -> Path:
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
    try:
        return json.loads(pid_file(url).read_text())
    except (OSError, ValueError):
        return None




def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of the log's latest run ('' if unreadable). Reads only the
    file's end (``wait_ready`` calls it 4 times a second; a log grows to 10 MiB)."""
    try:
        found = last_lines(path, lines)
    except OSError:
        return ""
    starts = [i for i, line in enumerate(found) if line.startswith(RUN_SEPARATOR[1:])]
    if starts:
        found = found[starts[-1]:]
        found[0] = found[0][len(RUN_SEPARATOR) - 1:]
    return "\n".join(found)


def running_server_info(url: ServerURL) -> dict | None:
    """The pid file's content for ``url``'s port when it names a live mlx-kit server
    process of this user (same pid, start time and command line), else None. Asks no
    HTTP: a server still loading its model counts."""
    info = read_pid_file(url)
    return info if info and _process_matches(info) is not None else None


def start_detached(url: ServerURL, model: str | None, extra: list[str] | None = None
                   ) -> tuple[subprocess.Popen, Path]:
    """Start ``mlx-kit serve`` in its own session, logging to the log file (its stdout
    and stderr too, until ``serve`` takes the file over: kit/logfile.py rotates it)."""
    log = log_file(url)
    log_dir(create=True)  # 0700 when we create it
    cmd = [sys.executable, "-m", "kit", "serve", "--host", url.host, "--port", str(url.port),
           "--log-file", str(log)]
    if model:
        cmd += ["--model", model]
    cmd += extra or []
    with open_private(log, "ab") as out:  # 0600: it holds prompts and command lines
        out.write(f"{RUN_SEPARATOR}{time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n"
                  .encode())
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True)
    return proc, log


def wait_ready(url: ServerURL, proc: subprocess.Popen | None, log: Path, timeout: float,
               on_wait: Callable[[str], None] = lambda _: None) -> Probe:
    """Poll /health until the server says ok (waiting through ``loading`` and
    ``restarting``: the server restarts an engine process that died on its own).

    Args:
        proc: the process we started (its exit ends the wait early), or None.
        on_wait: called while waiting with "</health status>[, <phase>]: <the log's last
            mlx_kit line>" (the line alone before /health answers), for a progress display.

    Raises:
        ServerError: the process died, the server says ``failed`` (the model failed to
            load, or the engine died while loading or too often), or ``timeout`` seconds
            passed; the message carries the log's tail.
        ModelDoesNotFitError: the server says ``failed`` because the model does not fit
            (/health's ``error_type`` ``model_does_not_fit``; exit 5).
    """
    deadline = time.monotonic() + timeout
    while True:
        p = probe(url, timeout=1.0)
        if p.ready:
            return p
        if p.kind == "ours" and p.health and p.health.status == "failed":
            # (an engine that died is restarted by the server: "restarting", waited for)
            message = (f"the server's engine failed: {p.health.error}\n{tail(log)}")
            hint = (f"`mlx-kit swap MODEL` to a model that loads, or `mlx-kit stop` and "
                    f"retry; full log: {log}")
            if p.health.error_type == error_kind(ModelDoesNotFitError("")):
                raise ModelDoesNotFitError(message, hint)  # the CLI's exit 5
            raise ServerError(message, hint=hint)
        if proc is not None and proc.poll() is not None:
            raise ServerError(f"the server exited (code {proc.returncode}) before it was "
                              f"ready:\n{tail(log)}", hint=f"full log: {log}")
        if time.monotonic() > deadline:
            raise ServerError(f"the server was not ready after {timeout:.0f} s:\n{tail(log)}",
                              hint=f"full log: {log}; raise --timeout for big models")
        # Show what the server says about itself (conversion, loading), not access logs,
        # after its state from /health (and its load phase, when it reports one): a log
        # line alone may read "serving" while the model still loads.
        ours = [ln for ln in tail(log, 50).splitlines() if " mlx_kit." in ln]
        line = ours[-1].split(": ", 1)[-1][:100] if ours else "starting"
        h = p.health
        state = (h.status if h else "starting") + (f", {h.phase}" if h and h.phase else "")
        on_wait(f"{state}: {line}" if p.kind == "ours" else line)
        time.sleep(0.25)


def ensure_server(url: ServerURL, model: str | None, timeout: float,
                  on_wait: Callable[[str], None] = lambda _: None,
                  serve_args: list[str] | None = None) -> tuple[Probe, bool]:
    """Reuse the mlx-kit server at ``url`` or start one (``serve_args``: more options for
    the ``serve`` it starts, e.g. ``--trust-remote-code``; a reused server keeps its own).

    Returns:
        (the ready probe, whether we started it)

    Raises:
        PortInUseError: something else answers at ``url``.
        ServerError: the server could not be started (see :func:`wait_ready`).
    """
    p = probe(url)
    if p.ready:
        return p, False
    # One launcher at a time may start a server for this port: a second one waits here,
    # then finds the first one's server and reuses it.
    try:
        with FileLock(str(state_dir(create=True) / f"server-{url.port}.lock"), timeout=timeout):
            p = probe(url)
            if p.ready:
                return p, False
            return _start_or_wait(url, p, model, timeout, on_wait, serve_args)
    except FileLockTimeout:
        raise ServerError(f"another mlx-kit launch is still starting the server at {url.root}",
                          hint=f"wait for it, or see {log_file(url)}") from None


def _start_or_wait(url: ServerURL, p: Probe, model: str | None, timeout: float,
                   on_wait: Callable[[str], None], serve_args: list[str] | None = None
                   ) -> tuple[Probe, bool]:
    if p.kind == "other":
        raise PortInUseError(f"{url.root} is in use by something that is not mlx-kit "
                             f"({p.detail})", hint="stop it, or use --url with another port")
    if p.kind == "ours":  # up, still loading
        return wait_ready(url, None, log_file(url), timeout, on_wait), False
    if url.root.startswith("https:"):
        raise ServerError(f"nothing answers at {url.root}, and mlx-kit serves plain HTTP",
                          hint="use an http:// URL to start a local server")
    proc, log = start_detached(url, model, serve_args)
    try:
        return wait_ready(url, proc, log, timeout, on_wait), True
    except BaseException:  # never leave behind a server the user did not get
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        raise


def admin_swap(url: ServerURL, model: str, timeout: float = 600) -> dict:
    """Ask the server at ``url`` to swap to ``model`` through its admin API.

    Raises:
        ServerError: no admin token (the server was not started by this user here), or
            the server refused the swap (its message, e.g. not found).
        ModelDoesNotFitError: the server refused it for memory (HTTP 507).
    """
    info = read_pid_file(url)
    if not info or not info.get("admin_token"):
        raise ServerError(f"no admin token for the server at {url.root}",
                          hint="swap works with a server started by `mlx-kit serve`/`launch` "
                               "as this user on this machine")
    try:
        r = httpx.post(url.root + "/admin/swap", json={"model": model}, timeout=timeout,
                       headers={"Authorization": f"Bearer {info['admin_token']}"})
    except httpx.HTTPError as e:
        raise ServerError(f"the server at {url.root} did not answer the swap: {e}") from None
    try:
        body = r.json()
    except ValueError:
        body = {}
    if r.status_code != 200:
        message = (body.get("error") or {}).get("message") or f"HTTP {r.status_code}"
        if r.status_code == 507:  # insufficient_memory: the CLI's "does not fit" exit code
            raise ModelDoesNotFitError(f"swap to {model} failed: {message}",
                                       hint="a smaller or more quantized model, or a larger "
                                            "--memory-budget (`mlx-kit fit MODEL` estimates)")
        raise ServerError(f"swap to {model} failed: {message}")
    return body


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
