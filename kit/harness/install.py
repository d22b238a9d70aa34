"""Install, remove and report agent configurations (the harness lifecycle).

install: render -> refuse to overwrite a file that is not ours (or a read-only one) ->
backup and receipt (:mod:`kit.harness.evidence`) -> write atomically -> record in the
manifest. Removal is :mod:`kit.harness.removal` (``remove`` and ``Removal`` are re-exported
here).
"""

from __future__ import annotations

import difflib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.errors import HarnessError
from kit.harness import evidence, manifest
from kit.harness.files import atomic_write, check_writable, make_parents, read_text, sha256_text
from kit.harness.recover import is_ours as _is_ours
from kit.harness.removal import Removal, file_errors as _file_errors, remove, trusted
from kit.harness.render import context, render
from kit.harness.formats import loads
from kit.harness.merge import content_fingerprint, merge, merged_again
from kit.harness.spec import FileSpec, HarnessSpec
from kit.probe import fetch_models
from kit.urls import ServerURL


class EditedFileError(HarnessError):
    """A file mlx-kit wrote was edited since; install will not overwrite the edits."""


@dataclass
class Change:
    """One file an install would write: ``old`` is None when the file does not exist."""

    path: Path
    new: str
    old: str | None
    spec: FileSpec | None = None
    owned: dict | None = None  # merge mode: what we own in the file (merge.merge's record)

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def diff(self) -> str:
        return "".join(difflib.unified_diff(
            (self.old or "").splitlines(keepends=True), self.new.splitlines(keepends=True),
            fromfile=str(self.path) if self.old is not None else "/dev/null",
            tofile=str(self.path)))


@dataclass
class InstallResult:
    """What install did: ``recovered`` is the removal it ran first when the manifest had
    no record to trust of an earlier install (see :mod:`kit.harness.recover`)."""

    changes: list[Change]
    baked_source: str
    written: list[Path] = field(default_factory=list)
    recovered: Removal | None = None


def baked_models(url: ServerURL) -> tuple[list[dict[str, Any]], str]:
    """Models to bake into static configs: the live server's list, else the local cache.

    Returns:
        (entries shaped like /v1/models entries with ``local`` first, where they came from)
    """
    keep = ("id", "name", "model", "context_window", "max_tokens", "capabilities")
    live = fetch_models(url, api_key=os.environ.get("MLX_KIT_API_KEY"))
    if live:  # keep what describes a model, not volatile fields like "created"
        return ([{k: m[k] for k in keep if k in m} for m in live if isinstance(m, dict)],
                f"probe of {url.v1}/models")
    from kit.models.catalog import scan, served_entries

    entries = served_entries([e for e in scan() if e.loadable])  # a server started now
    return ([{k: m[k] for k in keep} for m in entries],
            f"local model cache; no mlx-kit server answered at {url.v1}")


def plan(spec: HarnessSpec, url: ServerURL) -> InstallResult:
    """Render ``spec``'s files for ``url`` and compare them with what is on disk."""
    models, source = baked_models(url)
    rendered = render(spec, context(url.v1, models, source))
    changes = []
    for fspec, path in spec.file_paths():
        old = read_text(path) if path.is_file() else None
        if fspec.merge is not None:
            new, owned = merge(fspec.merge, old, rendered[fspec.path], str(path))
            changes.append(Change(path, new, old, fspec, owned))
        else:
            changes.append(Change(path, rendered[fspec.path], old, fspec))
    return InstallResult(changes, source)


def _lost_install(spec: HarnessSpec) -> bool:
    """Whether an earlier install left evidence (a receipt) that the manifest has no
    trusted record of."""
    entry = manifest.read()["agents"].get(spec.name) or {}
    if entry and all(trusted(spec.name, f) for f in entry["files"]):
        return False
    paths = [str(p) for _, p in spec.file_paths()] + [f["path"] for f in entry.get("files", [])]
    return any(evidence.read_receipt(spec.name, Path(p)) for p in paths)


def install(spec: HarnessSpec, url: ServerURL, *, dry_run: bool = False,
            force: bool = False) -> InstallResult:
    """Write ``spec``'s generated files and record them in the manifest.

    Args:
        dry_run: compute the changes only (``Change.diff()`` shows them).
        force: overwrite a file at our path that we did not write (it is backed up in
            the data dir, and ``remove`` puts it back).

    An earlier install that the manifest has no trustworthy record of (the manifest was
    corrupt, deleted or from another install) is first removed by what can be proved ours
    (``InstallResult.recovered`` says what that did), so the user's original is what gets
    backed up again, never a file holding our old entries.

    Raises:
        HarnessError: a file we did not write is in the way (and not ``force``), or a
            target is read-only or a folder.
    """
    recovered = None
    if not dry_run and _lost_install(spec):
        recovered = remove(spec)
    with _file_errors(f"read {spec.name}'s config"):
        result = plan(spec, url)
    result.recovered = recovered
    if dry_run:
        return result
    recorded_sha = {f["path"]: f.get("sha256") for f in
                    (manifest.read()["agents"].get(spec.name) or {}).get("files", [])}
    for ch in result.changes:
        if ch.owned is not None:  # merge: the file is the user's; only our entries change
            continue
        if ch.old is not None and not _is_ours(ch.old) and not force:
            raise HarnessError(f"{ch.path} exists and was not written by mlx-kit",
                               hint="move it away, or pass --force to overwrite it")
        sha = recorded_sha.get(str(ch.path))
        if ch.changed and ch.old is not None and sha and sha256_text(ch.old) != sha \
                and not force:
            raise EditedFileError(f"{ch.path} was edited since mlx-kit wrote it; not "
                                  "overwriting your edits", hint="pass --force to regenerate it")
    for ch in result.changes:
        if ch.changed or ch.old is None:
            check_writable(ch.path)
    with _file_errors(f"write {spec.name}'s config"), manifest.editing() as data:
        entry = data["agents"].get(spec.name) or {"files": []}
        recorded = {f["path"]: f for f in entry["files"]}
        files = []
        for ch in result.changes:
            prev = recorded.get(str(ch.path), {})
            created = prev.get("created_dirs", [])
            backup = prev.get("backup")
            install_id = prev.get("install_id") or evidence.new_install_id()
            entry: dict[str, Any] = {}
            if ch.owned is not None:  # merge: remember the user's original file once
                entry = {"mode": "merge", "owned": merged_again(prev.get("owned"), ch.owned),
                         "created_file": prev.get("created_file", ch.old is None),
                         "original_fp": prev.get("original_fp")}
                if not prev and ch.old is not None:
                    backup = str(evidence.save_backup(spec.name, ch.path, ch.old))
                    entry["original_fp"] = content_fingerprint(ch.spec.merge, ch.old,
                                                               str(ch.path))
                existed = not entry["created_file"]
            else:
                existed = ch.old is not None and not _is_ours(ch.old)
                if existed:  # forced: keep the user's file
                    backup = str(evidence.save_backup(spec.name, ch.path, ch.old))
                existed = existed or bool(backup)
            if ch.changed:
                created = created + [str(p) for p in make_parents(ch.path)]
            # The receipt first: a crash between it and the manifest leaves evidence that
            # proves no more than the markers do, never a write with no evidence at all.
            evidence.write_receipt(spec.name, ch.path, existed=existed, created_dirs=created,
                                   install_id=install_id, sha256=sha256_text(ch.new))
            if ch.changed:
                atomic_write(ch.path, ch.new)
                result.written.append(ch.path)
            files.append({"path": str(ch.path), "sha256": sha256_text(ch.new),
                          "created_dirs": created, "backup": backup,
                          "install_id": install_id, **entry})
        # Files recorded at other paths (the agent's config dir moved, e.g. through its env
        # var) stay recorded while they exist, so `remove` still finds them.
        paths = {f["path"] for f in files}
        files += [f for p, f in recorded.items() if p not in paths and Path(p).is_file()]
        data["agents"][spec.name] = {"base_url": url.v1, "installed_at": time.time(),
                                     "files": files}
    return result


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


def binary_version(binary: str, timeout: float = 15) -> str | None:
    """The first line ``<binary> --version`` prints, or None."""
    import subprocess

    try:
        r = subprocess.run([binary, "--version"], capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (r.stdout or r.stderr).strip().splitlines()
    return lines[0][:80] if lines else None


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
    from kit.harness.merge import owned_fingerprints

    return owned_fingerprints(fspec.merge, doc, recorded.get("owned", {})) != \
        recorded.get("owned", {}).get("entries", {})


def installed_agents() -> list[str]:
    """The agents the manifest says mlx-kit configured."""
    return sorted(manifest.read()["agents"])


def status(spec: HarnessSpec) -> AgentStatus:
    """Is the agent configured (our files present), where, and is its binary on PATH?"""
    files = spec.file_paths()
    paths = tuple(p for _, p in files)
    entry = manifest.read()["agents"].get(spec.name) or {}
    recorded = {f["path"]: f for f in entry.get("files", [])}

    def configured(fspec: FileSpec, p: Path) -> bool:
        if not p.is_file():
            return False
        if fspec.merge is None:
            return _is_ours(read_text(p, errors="replace"))
        # our entries were merged in (the receipt says so when the manifest is lost)
        return str(p) in recorded or evidence.read_receipt(spec.name, p) is not None

    installed = all(configured(fs, p) for fs, p in files)
    drift = tuple(p for fs, p in files if str(p) in recorded and _drifted(fs, p, recorded[str(p)]))
    return AgentStatus(spec.name, installed, paths, shutil.which(spec.binary), drift,
                       entry.get("base_url"))
