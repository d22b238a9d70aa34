"""Proxy variables that would send the server's loopback traffic to a proxy.

httpx (mlx-kit's own CLI: ``launch``'s probe, ``status``; and Python agents on httpx)
reads ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` (any case) and bypasses only the hosts
``NO_PROXY`` names: it does not exempt loopback by itself, and ``NO_PROXY=localhost`` does
not cover ``127.0.0.1`` (httpx/_utils.py ``get_environment_proxies``: an IP entry matches
that IP only, a name matches itself and its subdomains, ``*`` matches all). Node's own
``fetch``/``http`` ignore these variables unless ``NODE_USE_ENV_PROXY=1`` (or
``--use-env-proxy``; Node 22.21+/24), but agents that install a proxy agent themselves
honour them, so a variable that does not route the server's scheme still gets a warning.

On macOS, with no proxy variable set at all, httpx falls back on the system's proxy
settings (``urllib.request.getproxies``) and ignores their exception list: that is a
failure too.

The matching is our own code (a few lines): httpx's matcher is private, and urllib's
``proxy_bypass_environment`` differs from httpx for IPs and ports.
"""

from __future__ import annotations

import ipaddress
import os
import sys

from kit.doctor.check import Check
from kit.urls import ServerURL

_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
#: what the fix tells the user to export: loopback by name, IPv4 and IPv6
NO_PROXY_VALUE = "localhost,127.0.0.1,::1"


def _get(name: str, environ: dict[str, str]) -> str | None:
    """A proxy variable, lower case first (curl's and urllib's order), blank as unset."""
    value = environ.get(name.lower()) or environ.get(name)
    return value.strip() if value and value.strip() else None


def bypassed(host: str, no_proxy: str) -> bool:
    """Whether ``NO_PROXY``'s value exempts ``host`` under httpx's rules."""
    host = host.strip("[]").lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        entry = entry.split("://", 1)[-1].strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if ip is not None:  # httpx matches an IP entry exactly (a /8 suffix is dropped)
            try:
                if ip == ipaddress.ip_address(entry.split("/")[0]):
                    return True
            except ValueError:
                pass
            continue
        name = entry.rsplit(":", 1)[0]  # a port after a name
        if host == name.lstrip(".") and not name.startswith(".") or \
                host.endswith("." + name.lstrip(".")):
            return True
    return False


def _system_proxies() -> list[str]:
    """The schemes (``http``, ``https``) that macOS's network settings send through a
    proxy, when no proxy variable is set: httpx reads ``urllib.request.getproxies()``,
    which falls back on them there, and takes no exceptions from them (only
    ``NO_PROXY``'s). Empty off macOS."""
    if sys.platform != "darwin" or any(
            k.lower().endswith("_proxy") and v.strip() for k, v in os.environ.items()):
        return []
    import urllib.request

    try:
        found = urllib.request.getproxies()
    except Exception:  # the system configuration could not be read: nothing to report
        return []
    return sorted(k for k in ("http", "https") if found.get(k))


def proxy_check(url: ServerURL, environ: dict[str, str] | None = None) -> Check:
    """The ``proxy`` line: fail when a variable sends ``url`` through a proxy in httpx
    (launch's own requests go there: the server looks absent or foreign), warn when one
    is set without loopback in ``NO_PROXY`` but does not route ``url``'s scheme (agents
    that proxy every request still would)."""
    system = environ is None and _system_proxies()
    environ = dict(os.environ) if environ is None else environ
    set_ = {v: _get(v, environ) for v in _VARS if _get(v, environ)}
    no_proxy = _get("NO_PROXY", environ) or ""
    data = {"set": sorted(set_), "no_proxy": no_proxy or None}
    if system:
        # no proxy variable at all (not even NO_PROXY, which alone turns this off)
        return Check("network", "proxy", "fail", f"the macOS network settings set a proxy "
                     f"({', '.join(sorted(system))}): httpx sends requests to {url.root} "
                     "there", f"export NO_PROXY={NO_PROXY_VALUE} no_proxy={NO_PROXY_VALUE}",
                     {**data, "system": system})
    if not set_:
        return Check("network", "proxy", "ok", "no proxy variables set", data=data)
    if bypassed(url.host, no_proxy):
        return Check("network", "proxy", "ok", f"{', '.join(sorted(set_))} set; NO_PROXY "
                     f"exempts {url.host}", data=data)
    scheme = url.root.split(":", 1)[0].upper()
    routing = [v for v in (f"{scheme}_PROXY", "ALL_PROXY") if v in set_]
    fix = f"export NO_PROXY={NO_PROXY_VALUE} no_proxy={NO_PROXY_VALUE}"
    if routing:
        return Check("network", "proxy", "fail", f"{routing[0]} is set and NO_PROXY does not "
                     f"name {url.host}: requests to {url.root} go to the proxy", fix,
                     {**data, "routes": routing})
    return Check("network", "proxy", "warn", f"{', '.join(sorted(set_))} set and NO_PROXY "
                 f"does not name {url.host}: agents that proxy every request would send "
                 "the server's traffic there", fix, {**data, "routes": []})
