"""Start, find and stop the background server: reuse it if it answers, else start one.

The detached server writes ``server-<port>.json`` (pid, url, model, log) in the state dir
and logs to ``server-<port>.log`` in the log dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
from filelock import FileLock
from filelock import Timeout as FileLockTimeout

from kit.errors import PortInUseError, ServerError
from kit.paths import log_dir, state_dir
from kit.probe import Probe, probe
from kit.urls import ServerURL


def pid_file(url: ServerURL) -> Path:
    return state_dir() / f"server-{url.port}.json"


def log_file(url: ServerURL) -> Path:
    return log_dir() / f"server-{url.port}.log"


def write_pid_file(url: ServerURL, model: str, log: Path | None, admin_token: str) -> Path:
    """Record this process as the server for ``url`` (called by ``serve``). The file holds
    the admin token, so it is readable by this user only (0600)."""
    path = pid_file(url)
    text = json.dumps({"pid": os.getpid(), "url": url.root, "model": model,
                       "log": str(log) if log else None, "started": time.time(),
                       "admin_token": admin_token})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
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


#: start_detached writes this before each start, so a tail can show the current run only.
RUN_SEPARATOR = "\n--- "


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of the log's latest run ('' if unreadable)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rsplit(RUN_SEPARATOR, 1)[-1].splitlines()[-lines:])


def start_detached(url: ServerURL, model: str | None, extra: list[str] | None = None
                   ) -> tuple[subprocess.Popen, Path]:
    """Start ``mlx-kit serve`` in its own session, logging to the log file."""
    log = log_file(url)
    cmd = [sys.executable, "-m", "kit", "serve", "--host", url.host, "--port", str(url.port),
           "--log-file", str(log)]
    if model:
        cmd += ["--model", model]
    cmd += extra or []
    with open(log, "ab") as out:
        out.write(f"{RUN_SEPARATOR}{time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n"
                  .encode())
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True)
    return proc, log


def wait_ready(url: ServerURL, proc: subprocess.Popen | None, log: Path, timeout: float,
               on_wait: Callable[[str], None] = lambda _: None) -> Probe:
    """Poll /health until the server says ok.

    Args:
        proc: the process we started (its exit ends the wait early), or None.
        on_wait: called with the log's last line while waiting (for a progress display).

    Raises:
        ServerError: the process died, the model failed to load, or ``timeout`` seconds
            passed; the message carries the log's tail.
    """
    deadline = time.monotonic() + timeout
    while True:
        p = probe(url, timeout=1.0)
        if p.ready:
            return p
        if p.kind == "ours" and p.health and p.health.get("status") == "failed":
            raise ServerError(f"the server could not load its model: {p.health.get('error')}"
                              f"\n{tail(log)}", hint=f"full log: {log}")
        if proc is not None and proc.poll() is not None:
            raise ServerError(f"the server exited (code {proc.returncode}) before it was "
                              f"ready:\n{tail(log)}", hint=f"full log: {log}")
        if time.monotonic() > deadline:
            raise ServerError(f"the server was not ready after {timeout:.0f} s:\n{tail(log)}",
                              hint=f"full log: {log}; raise --timeout for big models")
        # Show what the server says about itself (conversion, loading), not access logs.
        ours = [ln for ln in tail(log, 50).splitlines() if " mlx_kit." in ln]
        on_wait(ours[-1].split(": ", 1)[-1][:100] if ours else "starting")
        time.sleep(0.25)


def ensure_server(url: ServerURL, model: str | None, timeout: float,
                  on_wait: Callable[[str], None] = lambda _: None) -> tuple[Probe, bool]:
    """Reuse the mlx-kit server at ``url`` or start one.

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
        with FileLock(str(state_dir() / f"server-{url.port}.lock"), timeout=timeout):
            p = probe(url)
            if p.ready:
                return p, False
            return _start_or_wait(url, p, model, timeout, on_wait)
    except FileLockTimeout:
        raise ServerError(f"another mlx-kit launch is still starting the server at {url.root}",
                          hint=f"wait for it, or see {log_file(url)}") from None


def _start_or_wait(url: ServerURL, p: Probe, model: str | None, timeout: float,
                   on_wait: Callable[[str], None]) -> tuple[Probe, bool]:
    if p.kind == "other":
        raise PortInUseError(f"{url.root} is in use by something that is not mlx-kit "
                             f"({p.detail})", hint="stop it, or use --url with another port")
    if p.kind == "ours":  # up, still loading
        return wait_ready(url, None, log_file(url), timeout, on_wait), False
    if url.root.startswith("https:"):
        raise ServerError(f"nothing answers at {url.root}, and mlx-kit serves plain HTTP",
                          hint="use an http:// URL to start a local server")
    proc, log = start_detached(url, model)
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
            the server refused the swap (its message, e.g. not found / does not fit).
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
        raise ServerError(f"swap to {model} failed: {message}")
    return body


def server_pid(url: ServerURL) -> int | None:
    """The pid of the mlx-kit server at ``url``: from /health, else the pid file."""
    p = probe(url)
    if p.kind == "ours" and p.health and p.health.get("pid"):
        return int(p.health["pid"])
    info = read_pid_file(url)
    if info and _is_our_server(int(info["pid"]), url):
        return int(info["pid"])
    return None


def _is_our_server(pid: int, url: ServerURL) -> bool:
    """Whether ``pid`` runs ``mlx-kit serve`` on ``url``'s port (a stale pid file may
    name a pid the system has since given to another program)."""
    try:
        cmd = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return "serve" in cmd and any("kit" in c for c in cmd[:3]) and (
        str(url.port) in cmd if "--port" in cmd else url.port == 8090)


def stop_server(url: ServerURL, timeout: float = 15.0) -> int | None:
    """Stop the server at ``url`` (SIGTERM, then SIGKILL after ``timeout``).

    Returns:
        The pid stopped, or None if no mlx-kit server was running there.
    """
    pid = server_pid(url)
    if pid is None:
        pid_file(url).unlink(missing_ok=True)  # stale, if any
        return None
    try:
        proc = psutil.Process(pid)
        proc.terminate()
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    except psutil.NoSuchProcess:
        pass
    pid_file(url).unlink(missing_ok=True)
    return pid
