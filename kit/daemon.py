"""Start, find and stop the background server: reuse it if it answers, else start one.
The pid file and the stop side are :mod:`kit.daemon_stop`'s, re-exported here (tests and
the CLI reach ``kit.daemon.stop_server``).

The detached server writes ``server-<port>.json`` (pid, start time, command line, url,
model, log, admin token; 0600) in the state dir and logs to ``server-<port>.log`` in the
log dir. ``stop`` signals only a process that file proves is ours (see :func:`stop_server`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from filelock import FileLock
from filelock import Timeout as FileLockTimeout

from kit.errors import ModelDoesNotFitError, PortInUseError, ServerError, error_kind
from kit.logfile import RUN_SEPARATOR, open_private
from kit.logread import last_lines
from kit.paths import log_dir, state_dir
from kit.probe import Probe, probe
from kit.urls import ServerURL
from kit.daemon_stop import (  # noqa: F401 (re-exported: the CLI imports them from here)
    Owned,
    _process_matches,
    is_loopback,
    log_file,
    owned_server,
    pid_file,
    read_pid_file,
    remove_pid_file,
    stop_server,
    write_pid_file,
)


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
