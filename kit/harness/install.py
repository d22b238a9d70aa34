"""Install, remove and report agent configurations (the harness lifecycle).

Both go plan -> apply: the inputs are gathered here (the spec, the models to bake in, the
rendered templates, the manifest's record of the agent), :mod:`kit.harness.plan` (install)
and :mod:`kit.harness.plan_remove` (removal) decide every file's change with the proof
that allows it (:mod:`kit.harness.proof`), and :mod:`kit.harness.apply` writes it.
``--dry-run`` prints the plan and stops there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.errors import HarnessError
from kit.harness import apply, evidence, manifest
from kit.harness.apply import Removal
from kit.harness.files import file_errors, read_text, sha256_text
from kit.harness.formats import loads
from kit.harness.merge import owned_fingerprints
from kit.harness.plan import EditedFileError, plan_install
from kit.harness.plan_remove import plan_remove
from kit.harness.plan_types import Plan, Step
from kit.harness.proof import is_ours
from kit.harness.render import context, render
from kit.harness.spec import FileSpec, HarnessSpec
from kit.knobs import env
from kit.harness.spec_loader import all_specs
from kit.harness.tools import find_agent
from kit.models.catalog import scan, served_entries
from kit.key_guard import why_not_send_key
from kit.probe import fetch_models, probe
from kit.urls import ServerURL

__all__ = ["AgentStatus", "EditedFileError", "InstallResult", "Removal", "baked_models",
           "install", "installed_agents", "plan", "plan_removal", "remove", "status"]


@dataclass
class InstallResult:
    """What install did: ``changes`` are the plan's steps (one per file: ``path``, ``old``,
    ``new``, ``action``, ``diff()``), ``written`` the files it wrote; ``recovered`` is the
    removal it ran first when the manifest had no record to trust of an earlier install."""

    changes: list[Step]
    baked_source: str
    written: list[Path] = field(default_factory=list)
    recovered: Removal | None = None
    plan: Plan | None = None


def baked_models(url: ServerURL) -> tuple[list[dict[str, Any]], str]:
    """Models to bake into static configs: the live server's list, else the local cache.

    Returns:
        (entries shaped like /v1/models entries with ``local`` first, where they came from)
    """
    keep = ("id", "name", "model", "context_window", "max_tokens", "capabilities")
    key = env("MLX_KIT_API_KEY")
    if key:  # only to a server the user's own process runs (kit/key_guard.py)
        found = probe(url)
        if found.kind != "ours" or why_not_send_key(url, found.health.pid if found.health
                                                    else None):
            key = None
    live = fetch_models(url, api_key=key)
    if live:  # keep what describes a model, not volatile fields like "created"
        return ([{k: m[k] for k in keep if k in m} for m in live if isinstance(m, dict)],
                f"probe of {url.v1}/models")

    entries = served_entries([e for e in scan() if e.loadable])  # a server started now
    return ([{k: m[k] for k in keep} for m in entries],
            f"local model cache; no mlx-kit server answered at {url.v1}")


def _entry(agent: str, *, quiet: bool) -> dict | None:
    """The manifest's record of ``agent``. ``quiet``: no warning about an unreadable
    manifest here (the locked edit that follows warns, and moves it aside)."""
    data = manifest.load()[0] if quiet else manifest.read()
    return data["agents"].get(agent)


def _claims(spec: HarnessSpec) -> dict[str, tuple[str, bool]]:
    """The paths of ``spec``'s files that another agent's install wrote: path -> (that
    agent, whether it merges into the file). From the manifest, and from the receipts of
    the other known agents (a lost manifest must not make their files anyone's)."""

    # by real path: a folder spelt "~/.pi/agent/extensions/.." or reached through a link
    # names pi's file as surely as "~/.pi/agent" does
    ours = {os.path.realpath(p): str(p) for _, p in spec.file_paths()}
    claims: dict[str, tuple[str, bool]] = {}
    for name, entry in manifest.load()[0]["agents"].items():
        for f in entry.get("files", []) if name != spec.name else []:
            if (mine := ours.get(os.path.realpath(f["path"]))) is not None:
                claims[mine] = (name, f.get("mode") == "merge")
    for name, other in all_specs().items():
        for fs, p in other.file_paths() if name != spec.name else []:
            mine = ours.get(os.path.realpath(p))
            if mine is not None and mine not in claims and evidence.read_receipt(name, p):
                claims[mine] = (name, fs.merge is not None)
    return claims


def plan(spec: HarnessSpec, url: ServerURL, *, force: bool = False,
         quiet: bool = False) -> Plan:
    """The plan of installing ``spec`` for the server at ``url``: every file's action,
    new text, the proof that allows it; nothing is written.

    Raises:
        HarnessError: a template does not render, or a target cannot be read.
    """
    models, source = baked_models(url)
    rendered = render(spec, context(url.v1, models, source))
    with file_errors(f"read {spec.name}'s config"):
        return plan_install(spec, rendered, _entry(spec.name, quiet=quiet), force=force,
                            base_url=url.v1, baked_source=source, claims=_claims(spec))


def install(spec: HarnessSpec, url: ServerURL, *, dry_run: bool = False,
            force: bool = False) -> InstallResult:
    """Write ``spec``'s generated files and record them in the manifest (plan -> apply).

    Args:
        dry_run: compute the plan only (``InstallResult.plan``; ``Step.diff()`` shows
            each change); a refused step is then in the plan, not raised.
        force: overwrite a file at our path that we did not write (it is backed up in
            the data dir, and ``remove`` puts it back).

    An earlier install that the manifest has no trustworthy record of (the manifest was
    corrupt, deleted or from another install) is first removed by what can be proved ours
    (``InstallResult.recovered`` says what that did), so the user's original is what gets
    backed up again, never a file holding our old entries.

    Raises:
        HarnessError: a file we did not write is in the way (and not ``force``), or a
            target is read-only or a folder. EditedFileError: a file we wrote was edited.
    """
    p = plan(spec, url, force=force, quiet=not dry_run)
    if dry_run:
        return InstallResult(p.steps, p.baked_source, plan=p)
    written, recovered = apply.install(p)
    return InstallResult(p.steps, p.baked_source, written, recovered, p)


def plan_removal(spec: HarnessSpec, *, force: bool = False, quiet: bool = False) -> Plan:
    """The plan of removing ``spec``'s files (see :func:`remove`); nothing is written.

    Raises:
        HarnessError: a target cannot be read.
    """
    with file_errors(f"read {spec.name}'s config"):
        return plan_remove(spec, _entry(spec.name, quiet=quiet), force=force,
                           claims=_claims(spec))


def remove(spec: HarnessSpec, *, force: bool = False) -> Removal:
    """Delete the files mlx-kit wrote for ``spec``, take its entries out of shared files,
    put back any user file that install replaced, delete the folders install created (if
    empty), and the backups and receipts of all that (plan -> apply).

    A file whose manifest record cannot be trusted (no record: the manifest is corrupt or
    gone; or a record from another install) is planned from what carries our marker or is
    proved ours by the backups. Every file is checked before any is changed.

    Raises:
        HarnessError: one of our files was edited since we wrote it (and not ``force``), a
            file is read-only or a folder, or a shared file no longer parses.
    """
    return apply.remove(plan_removal(spec, force=force, quiet=True))


@dataclass(frozen=True)
class AgentStatus:
    """One agent's state. ``drift`` lists our files (or merged entries) that changed since
    mlx-kit wrote them; ``base_url`` is the server the installed config points at."""

    name: str
    installed: bool
    paths: tuple[Path, ...]
    binary: str | None
    drift: tuple[Path, ...] = ()
    base_url: str | None = None
    #: where ``binary`` comes from: "tools" (mlx-kit's tools folder) or "path"; None: none
    binary_source: str | None = None


def _drifted(fspec: FileSpec, path: Path, recorded: dict) -> bool:
    if not path.is_file():
        return True
    text = read_text(path, errors="replace")
    if fspec.merge is None:
        return bool(recorded.get("sha256")) and sha256_text(text) != recorded["sha256"]
    try:
        doc = loads(fspec.merge.format, text, str(path))
    except HarnessError:
        return True
    return owned_fingerprints(fspec.merge, doc, recorded.get("owned", {})) != \
        recorded.get("owned", {}).get("entries", {})


def installed_agents() -> list[str]:
    """The agents the manifest says mlx-kit configured."""
    return sorted(manifest.read()["agents"])


def status(spec: HarnessSpec) -> AgentStatus:
    """Is the agent configured (our files present), where, and which binary runs (mlx-kit's
    tools folder's copy, else one on PATH: :func:`kit.harness.tools.find_agent`)?"""
    files = spec.file_paths()
    paths = tuple(p for _, p in files)
    entry = manifest.read()["agents"].get(spec.name) or {}
    recorded = {f["path"]: f for f in entry.get("files", [])}

    def configured(fspec: FileSpec, p: Path) -> bool:
        if not p.is_file():
            return False
        if fspec.merge is None:
            return is_ours(read_text(p, errors="replace"))
        # our entries were merged in (the receipt says so when the manifest is lost)
        return str(p) in recorded or evidence.read_receipt(spec.name, p) is not None

    installed = all(configured(fs, p) for fs, p in files)
    drift = tuple(p for fs, p in files if str(p) in recorded and _drifted(fs, p, recorded[str(p)]))
    found = find_agent(spec)
    return AgentStatus(spec.name, installed, paths, found.path if found else None, drift,
                       entry.get("base_url"), found.source if found else None)
