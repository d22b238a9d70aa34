"""The agents' side of ``doctor``: per agent the harness specs know (kit.harness), its
binary and version against the spec's ``verified`` range, and its config as ``mlx-kit
harness status`` computes it (installed, drifted, the URL it points at) against the
server ``launch`` would use. Agents neither installed nor configured share one line."""

from __future__ import annotations

from typing import Callable

from kit.doctor.check import Check, Status, worst
from kit.harness import install as hi
from kit.harness.spec import HarnessSpec
from kit.harness.spec_loader import all_specs
from kit.harness.versions import probe_versions, version_key
from kit.urls import ServerURL, parse_url

#: Seconds one agent's ``--version`` may take, as ``harness status`` allows (Node agents
#: start in 0.1-4 s; gemini took 7.6 s at a load of 10 on 2 cores); a hung binary counts
#: as no answer
VERSION_TIMEOUT_S = 15.0


def agent_checks(url: ServerURL, server_up: Callable[[], bool | None],
                 timeout: float = VERSION_TIMEOUT_S) -> list[Check]:
    """One line per agent whose binary is found or whose config is installed, then one
    line naming the others.

    Args:
        url: the server launch would use.
        server_up: returns whether our server answers at ``url`` (None: unknown); called
            once the versions are in, so the server probe runs meanwhile.
        timeout: seconds per ``--version``.
    """
    specs = list(all_specs().values())
    states = {s.name: hi.status(s) for s in specs}
    versions = probe_versions([(s, states[s.name].binary) for s in specs
                               if states[s.name].binary], timeout=timeout)
    up = server_up()
    checks, absent = [], []
    for spec in specs:
        st = states[spec.name]
        if not st.binary and not (st.installed and spec.files):
            absent.append(spec.name)
            continue
        checks.append(_agent(spec, st, versions.get(spec.name), url, up, timeout))
    if absent:
        checks.append(Check("agents", "not installed", "ok", ", ".join(absent) + " (mlx-kit "
                            "harness list says how to install each)",
                            data={"agents": absent}))
    return checks


def _agent(spec: HarnessSpec, st, v, url: ServerURL, up: bool | None,
           timeout: float) -> Check:
    """One agent's line: its binary part, its version part, its config part; the line's
    status is the worst part's, its fix the non-ok parts' fixes."""
    parts: list[tuple[Status, str, str | None]] = []
    verified = spec.verified
    span = None if verified is None else verified[0] if verified[0] == verified[1] \
        else f"{verified[0]}-{verified[1]}"
    if not st.binary:
        parts.append(("warn", f"{spec.binary} not found", spec.install_hint))
    elif v is None or v.version is None:
        said = (v.line if v else None) or f"no output within {timeout:g} s"
        parts.append(("warn", f"{spec.binary} --version gave no version ({said})",
                      f"run {spec.binary} --version yourself; if it fails or hangs, "
                      f"reinstall: {spec.install}"))
    elif verified is not None and version_key(v.version) > version_key(verified[1]):
        parts.append(("warn", f"{v.version} is newer than the newest verified ({verified[1]}): "
                      "untested", f"if launch misbehaves, install the verified one: "
                      f"{spec.install}"))
    elif verified is not None and version_key(v.version) < version_key(verified[0]):
        parts.append(("warn", f"{v.version} is older than the oldest verified ({verified[0]})",
                      f"upgrade: {spec.install}"))
    else:
        parts.append(("ok", v.version + (f" (verified {span})" if span else ""), None))
    if not spec.files:  # nothing to write: launch sets the agent's environment
        parts.append(("ok", "configured by launch (environment)", None))
    elif not st.installed:
        parts.append(("ok", "not configured (launch configures it)", None))
    elif st.drift:
        paths = ", ".join(map(str, st.drift))
        parts.append(("warn", f"config edited since mlx-kit wrote it: {paths}",
                      f"launch keeps your edits; to regenerate: mlx-kit harness install "
                      f"{spec.name} --force"))
    else:
        parts.append(("ok", "configured", None))
    base = st.base_url
    if st.installed and base:
        if parse_url(base).root != url.root:
            parts.append(("warn", f"points at {base}, not {url.v1}",
                          f"mlx-kit launch {spec.name} rewrites it (or: mlx-kit harness "
                          f"install {spec.name} --url {url.root})"))
        else:
            state = "" if up is None else " (up)" if up else " (not running)"
            parts.append(("ok", f"points at {base}{state}", None))
    status = worst([p[0] for p in parts])
    fixes = [p[2] for p in parts if p[0] != "ok" and p[2]]
    data = {"binary": st.binary, "version": v.version if v else None,
            "version_line": v.line if v else None,
            "verified": list(verified) if verified else None, "installed": st.installed,
            "drift": [str(p) for p in st.drift], "base_url": base}
    return Check("agents", spec.name, status, "; ".join(p[1] for p in parts),
                 "; ".join(fixes) or None, data)
