"""Whether the API key may be sent to what listens at a loopback URL.

A free loopback port is any local user's to bind: another user's program that took the
port before our server (or after it stopped) would answer ``/health`` as ours and read the
key from the first request that carries it. So before mlx-kit sends the key (``launch``'s
check, the model list ``harness install`` bakes) or hands it to an agent, it proves that
the process listening on the port is the user's own: the ``pid`` that ``/health`` names
runs as this user and holds a listening socket on that very port (a stranger can claim any
pid, but not make that process listen on a port the stranger holds). Both facts come from
psutil, which reads a process of one's own on Linux and macOS alike.

A URL that is not loopback names another machine the user chose; what listens there
cannot be checked from here, and the key goes as the user configured it.
"""

from __future__ import annotations

import ipaddress
import os

from kit.urls import ServerURL


def loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost``,
    127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def why_not_send_key(url: ServerURL, pid: int | None) -> str | None:
    """Why the key must not go to ``url`` (a sentence for an error message), or None
    when it may: ``url`` is not loopback, or ``pid`` (what its ``/health`` says) is a
    process of this user that listens on ``url``'s port."""
    if not loopback(url.host):
        return None
    if not pid:
        return f"what answers at {url.root} names no process"
    import psutil  # only when a key is about to be sent

    try:
        process = psutil.Process(pid)
        uid = process.uids().real
        listening = getattr(process, "net_connections", None) or process.connections
        ports = {c.laddr.port for c in listening(kind="tcp") if c.status == psutil.CONN_LISTEN}
    except (psutil.Error, OSError):
        return (f"what answers at {url.root} says it is process {pid}, which is not a "
                "process of yours")
    if hasattr(os, "getuid") and uid != os.getuid():
        return f"process {pid} at {url.root} runs as another user (uid {uid})"
    if url.port not in ports:
        return (f"what answers at {url.root} says it is process {pid}, which does not "
                f"listen on port {url.port}: another program holds the port")
    return None
