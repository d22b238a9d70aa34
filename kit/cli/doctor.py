"""``mlx-kit doctor``: one report of everything that decides whether ``launch`` works
(the checks are kit.doctor's; this module prints them)."""

from __future__ import annotations

from typing import Optional

import typer

from kit.cli.options import URL
from kit.cli.output import JSON
from kit.errors import ExitCode

#: how each status is shown, and its colour on a terminal
_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def doctor(url: Optional[str] = URL, as_json: bool = JSON) -> None:
    """Check everything `mlx-kit launch` needs: Python, mlx and its device (and
    OpenBLAS on Linux CPU), the server on the URL (version, model, API key, a port
    taken by another program), proxy variables that would catch loopback traffic,
    the Hugging Face cache and the starter model, and each agent (binary, version
    against the verified range, config installed, edited, and the URL it points at).
    Each line is ok, warn or fail, with a one-line fix when not ok. Every check is
    bounded in time (mlx is imported in a child process).

    \b
    Exit codes:
      0  no line failed (warnings alone still exit 0)
      1  at least one line failed

    \b
    --json: {"url", "ok", "summary": {"ok", "warn", "fail"}, "checks":
    [{"area", "name", "status": "ok"|"warn"|"fail", "detail", "fix", "data"}]}.
    """
    from kit.doctor.run import run_checks
    from kit.urls import parse_url

    u = parse_url(url)
    checks = run_checks(u)
    summary = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail")}
    if as_json:
        from kit.cli.output import emit_json

        emit_json({"url": u.v1, "ok": summary["fail"] == 0, "summary": summary,
                   "checks": [c.to_json() for c in checks]})
    else:
        _print(u.v1, checks, summary)
    if summary["fail"]:
        raise typer.Exit(ExitCode.ERROR)


def _print(url: str, checks: list, summary: dict[str, int]) -> None:
    """The report as text: one block per area, a line per check (``status  name
    detail``), its fix under it, then the counts."""
    from rich.text import Text

    from kit.cli.console import console

    width = max((len(c.name) for c in checks), default=0)
    console.print(f"mlx-kit doctor: server URL {url}", markup=False)
    area = None
    for c in checks:
        if c.area != area:
            area = c.area
            console.print(Text(area, style="bold"))
        console.print(Text.assemble("  ", (f"{c.status:<4}", _STYLE[c.status]),
                                    f"  {c.name:<{width}}  {c.detail}"))
        if c.fix:
            console.print(Text(f"        {'':<{width}}  fix: {c.fix}"))
    n_warn, n_fail = summary["warn"], summary["fail"]
    verdict = ("launch should work" if not n_fail else "launch will fail until the "
               "failed lines are fixed")
    console.print(f"{n_fail} failed, {n_warn} warning{'s' if n_warn != 1 else ''}: "
                  f"{verdict}", markup=False)
