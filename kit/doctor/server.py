"""The server's side of ``doctor``: what answers on the configured URL (our server, its
version, model and model state; nothing; or another program holding the port) and
whether it wants an API key that this shell does not have. One probe (kit.probe, the one
``launch`` and ``status`` use), each request bounded by its timeout."""

from __future__ import annotations

from kit import __version__
from kit.doctor.check import Check
from kit.harness.spec import API_KEY_ENV
from kit.key_guard import why_not_send_key
from kit.knobs import env
from kit.probe import Probe, fetch_status, probe
from kit.urls import ServerURL

#: Seconds each request to the server may take (a hung server must not hang doctor)
TIMEOUT_S = 2.0


def server_checks(url: ServerURL, timeout: float = TIMEOUT_S) -> tuple[list[Check], Probe]:
    """The ``server``, ``model``, ``port`` and ``api key`` lines, and the probe they came
    from (the agents' lines compare their configured URL with it)."""
    p = probe(url, timeout=timeout)
    data = {"url": url.v1, "kind": p.kind}
    if p.kind == "none" and url.root.startswith("https:"):  # launch's own refusal
        return [Check("server", "server", "fail", f"nothing answers at {url.root}, and "
                      "mlx-kit serves plain HTTP", "use an http:// URL to start a local "
                      "server", {**data, "running": False})], p
    if p.kind == "none":
        return [Check("server", "server", "ok", f"no server at {url.root} (`mlx-kit launch` "
                      "starts one)", data={**data, "running": False}),
                Check("server", "port", "ok", f"{url.port} is free", data={"port": url.port})
                ], p
    if p.kind == "other":
        who = _listener(url.port)
        return [Check("server", "server", "fail", f"{url.root} is in use by something that "
                      f"is not mlx-kit ({p.detail})", "stop it, or use --url with another "
                      "port", {**data, "running": False, "detail": p.detail}),
                Check("server", "port", "fail", f"{url.port} is taken" + (f" by {who}" if who
                                                                           else ""),
                      f"stop it, or use another port: mlx-kit launch AGENT --url "
                      f"http://{url.host}:{url.port + 1} (or set MLX_KIT_URL)",
                      {"port": url.port, "holder": who})], p
    h = p.health
    assert h is not None  # "ours" always carries its body
    data.update(running=True, version=h.version, pid=h.pid, model=h.model,
                model_state=h.model_state, status=h.status)
    checks = []
    if h.version and h.version != __version__:
        checks.append(Check("server", "server", "warn", f"mlx-kit {h.version} at {url.root} "
                            f"(pid {h.pid}), but this mlx-kit is {__version__}",
                            "mlx-kit stop, then mlx-kit launch AGENT (starts this version)",
                            data))
    else:
        checks.append(Check("server", "server", "ok", f"mlx-kit {h.version} at {url.root} "
                            f"(pid {h.pid})", data=data))
    checks.append(_model(h))
    checks.append(Check("server", "port", "ok", f"{url.port} is mlx-kit's (pid {h.pid})",
                        data={"port": url.port, "holder": f"mlx-kit (pid {h.pid})"}))
    checks.append(_api_key(url, h.pid, timeout))
    return checks, p


def _model(h) -> Check:
    """``local -> MODEL (state)``: ok when the server answers (loaded or unloaded), warn
    while it loads or restarts, fail when the model failed."""
    phase = f", {h.phase}" if h.phase else ""
    detail = f"local -> {h.model} ({h.model_state}{phase})"
    data = {"model": h.model, "model_state": h.model_state, "error": h.error}
    if h.ok:
        return Check("server", "model", "ok", detail, data=data)
    if h.status == "failed":
        # the same way out as `mlx-kit status` gives
        return Check("server", "model", "fail", f"{detail}: {h.error or 'failed'}",
                     "mlx-kit swap MODEL (one that loads and fits), or mlx-kit stop and "
                     "launch again", data)
    return Check("server", "model", "warn", f"{detail}: {h.error or 'not ready yet'}",
                 "wait (mlx-kit status shows progress), or see mlx-kit logs", data)


def _api_key(url: ServerURL, pid: int | None, timeout: float) -> Check:
    """Whether the server wants a key, and whether ``MLX_KIT_API_KEY`` (what launch sends)
    is one it takes. The key goes only where launch would send it (kit.key_guard)."""
    status = fetch_status(url, None, timeout=timeout)
    if status != 401:
        return Check("server", "api key", "ok", "not required", data={"required": False})
    key = env(API_KEY_ENV)
    data = {"required": True, "env_set": bool(key)}
    if not key:
        return Check("server", "api key", "fail", f"the server at {url.root} requires an "
                     f"API key and {API_KEY_ENV} is not set",
                     f"export {API_KEY_ENV}=<the server's --api-key>", data)
    why = why_not_send_key(url, pid)
    if why:
        return Check("server", "api key", "fail", f"not sending your API key to {url.root}: "
                     f"{why}", "mlx-kit status shows what runs there; stop whatever is not "
                     "yours", data)
    if fetch_status(url, key, timeout=timeout) == 401:
        return Check("server", "api key", "fail", f"required, and {API_KEY_ENV} is not the "
                     "server's key", f"export {API_KEY_ENV}=<the server's --api-key>", data)
    return Check("server", "api key", "ok", f"required; {API_KEY_ENV} is accepted",
                 data=data)


def _listener(port: int) -> str | None:
    """``NAME (pid N)`` of the process listening on ``port``, as far as this user may see
    (psutil; other users' pids and, on macOS, all sockets may be hidden), else None."""
    import psutil

    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return f"{psutil.Process(c.pid).name()} (pid {c.pid})"
    except (psutil.Error, OSError):
        pass
    return None
