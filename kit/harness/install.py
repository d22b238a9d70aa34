"""Install, remove and report agent configurations (the harness lifecycle).

install: render -> refuse to overwrite a file that is not ours -> write atomically ->
record in the manifest. remove: delete only files whose content is still what we wrote (or
that carry our marker), then the folders we created if they are empty.
"""

from __future__ import annotations

import difflib
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit import STABLE_MODEL_ID
from kit.errors import HarnessError
from kit.harness import evidence, manifest, recover
from kit.harness.files import atomic_write, check_writable, make_parents, read_text, sha256_text
from kit.harness.recover import is_ours as _is_ours
from kit.harness.render import context, render
from kit.harness.formats import loads
from kit.harness.merge import content_fingerprint, merge, merged_again, unmerge
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
    recovered: "Removal | None" = None


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
    from kit.models.catalog import api_entry, scan
    from kit.models.starter import STARTER_ID

    # What a server started now would offer: local -> the starter, then the rest.
    catalog = {e.id: e for e in scan() if e.loadable}
    entries = [api_entry(mid, catalog.get(STARTER_ID), real_id=STARTER_ID)
               for mid in (STABLE_MODEL_ID, STARTER_ID)]
    entries += [api_entry(e.id, e, real_id=e.id) for e in catalog.values() if e.id != STARTER_ID]
    return ([{k: m[k] for k in keep} for m in entries],
            f"local model cache; no mlx-kit server answered at {url.v1}")


def _trusted(agent: str, f: dict) -> bool:
    """Whether a manifest record of a file is from the install that the evidence beside
    the backups describes (a record restored from another install is stale)."""
    receipt = evidence.read_receipt(agent, Path(f["path"]))
    if "install_id" not in f:  # recorded before receipts existed
        return receipt is None
    return receipt is not None and receipt.get("install_id") == f["install_id"] \
        and receipt.get("sha256") == f.get("sha256")


def _lost_install(spec: HarnessSpec) -> bool:
    """Whether an earlier install left evidence (a receipt) that the manifest has no
    trusted record of."""
    entry = manifest.read()["agents"].get(spec.name) or {}
    if entry and all(_trusted(spec.name, f) for f in entry["files"]):
        return False
    paths = [str(p) for _, p in spec.file_paths()] + [f["path"] for f in entry.get("files", [])]
    return any(evidence.read_receipt(spec.name, Path(p)) for p in paths)


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


@contextmanager
def _file_errors(action: str):
    """Report a file-system failure (read-only folder, permissions) as a HarnessError."""
    try:
        yield
    except OSError as e:
        raise HarnessError(f"cannot {action}: {e.strerror or e}"
                           + (f": {e.filename}" if e.filename else ""),
                           hint="check the folder's permissions") from None


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


@dataclass
class Removal:
    """What ``remove`` did: files and folders deleted, user files put back from backups,
    shared files our entries left; ``notes`` says what it left and why (one line each)."""

    removed: list[Path] = field(default_factory=list)
    restored: list[Path] = field(default_factory=list)
    unmerged: list[Path] = field(default_factory=list)  # shared files our entries left
    notes: list[str] = field(default_factory=list)


@dataclass
class _Step:
    """One file's part of a removal, decided before anything is changed."""

    path: Path
    action: str  # "none", "delete", "write" (text), "restore" (from backup)
    text: str | None = None
    backup: Path | None = None
    created_dirs: list[str] = field(default_factory=list)
    merged: bool = False


def remove(spec: HarnessSpec, *, force: bool = False) -> Removal:
    """Delete the files mlx-kit wrote for ``spec``, take its entries out of shared files,
    put back any user file that install replaced, delete the folders install created (if
    empty), and the backups and receipts of all that.

    A file whose manifest record cannot be trusted (no record: the manifest is corrupt or
    gone; or a record from another install) is handled by :mod:`kit.harness.recover`: only
    what carries our marker or is proved ours by the backups is touched. Every file is
    checked before any is changed.

    Raises:
        HarnessError: one of our files was edited since we wrote it (and not ``force``), a
            file is read-only or a folder, or a shared file no longer parses.
    """
    result = Removal()
    with _file_errors(f"remove {spec.name}'s config"), manifest.editing() as data:
        entry = data["agents"].get(spec.name) or {}
        recorded = {f["path"]: f for f in entry.get("files", [])}
        fspecs = {str(p): fs for fs, p in spec.file_paths()}
        steps = []
        for p in list(recorded) + [p for p in fspecs if p not in recorded]:
            f = recorded.get(p)
            if f is not None and _trusted(spec.name, f):
                steps.append(_planned(f, fspecs.get(p), force))
                continue
            if f is not None:
                result.notes.append(f"the manifest's record of {p} is from another install; "
                                    "worked from the file's markers and mlx-kit's backups")
            steps.append(_recovered(spec, fspecs.get(p), Path(p), result.notes))
        for step in steps:  # all checked above, before anything was changed
            _apply(spec, step, result)
        data["agents"].pop(spec.name, None)
    evidence.prune(spec.name)
    return result


def _planned(f: dict, fspec: FileSpec | None, force: bool) -> _Step:
    """A removal step from a trusted manifest record."""
    path = Path(f["path"])
    backup = Path(f["backup"]) if f.get("backup") else None
    step = _Step(path, "none", backup=backup, created_dirs=f.get("created_dirs", []))
    if f.get("mode") == "merge":
        step.merged = True
        step.action, step.text = _unmerged(f, fspec, force)
        return step
    if not path.is_file():
        return step
    text = read_text(path, errors="replace")
    if not _is_ours(text) and not force:
        raise HarnessError(f"{path} no longer carries mlx-kit's marker; not removing",
                           hint="pass --force to delete it anyway")
    if f["sha256"] and sha256_text(text) != f["sha256"] and not force:
        raise HarnessError(f"{path} was edited since mlx-kit wrote it",
                           hint="pass --force to delete it anyway")
    check_writable(path, "remove")
    step.action = "delete"
    return step


def _recovered(spec: HarnessSpec, fspec: FileSpec | None, path: Path,
               notes: list[str]) -> _Step:
    """A removal step with no trusted record: from the markers and the evidence."""
    step = _Step(path, "none", backup=evidence.backup_path(spec.name, path),
                 created_dirs=recover.created_dirs(spec, path))
    if fspec is not None and fspec.merge is not None:
        step.merged = True
        (step.action, arg), more = recover.plan_merged(spec, fspec, path)
        step.text = arg if step.action == "write" else None
    else:
        doomed, more = recover.plan_dropin(spec, path)
        step.action = "delete" if doomed else "none"
    notes.extend(more)
    return step


def _unmerged(f: dict, fspec: FileSpec | None, force: bool) -> tuple[str, str | None]:
    """What removing our entries from a merged file means: ("none", None) when there is
    nothing to do, ("delete", None), ("restore", None) or ("write", text).

    Raises:
        HarnessError: our entry was edited (and not ``force``), the file no longer parses,
            or it is read-only.
    """
    path = Path(f["path"])
    if not path.is_file() or fspec is None or fspec.merge is None:
        return "none", None
    current = read_text(path)
    text, is_empty = unmerge(fspec.merge, current, f["owned"], str(path), force=force)
    check_writable(path, "remove mlx-kit's entries from")
    if is_empty and f.get("created_file"):
        return "delete", None
    backup = Path(f["backup"]) if f.get("backup") else None
    if backup and backup.is_file() and f.get("original_fp") == content_fingerprint(
            fspec.merge, text, str(path)):
        return "restore", None  # same content as before install: put the exact bytes back
    return ("write", text) if text != current else ("none", None)


def _apply(spec: HarnessSpec, step: _Step, result: Removal) -> None:
    path = step.path
    if step.action == "delete":
        path.unlink()
        result.removed.append(path)
    elif step.action == "restore":
        shutil.copyfile(step.backup, path)  # copyfile keeps the file's own mode
        result.unmerged.append(path)
    elif step.action == "write":
        atomic_write(path, step.text)
        result.unmerged.append(path)
    if step.backup and step.backup.is_file() and not path.exists():
        shutil.move(str(step.backup), path)  # the user's own file, as it was
        result.restored.append(path)
    for folder in sorted(map(Path, step.created_dirs), key=lambda p: -len(p.parts)):
        try:
            folder.rmdir()  # only if empty: never delete what the user put there
            result.removed.append(folder)
        except OSError:
            pass
    kept = step.backup if step.backup and step.backup.is_file() else None
    if kept and step.action == "none":  # not used: the only copy of their earlier file
        result.notes.append(f"kept your file from before mlx-kit's install of {path} at "
                            f"{kept}")
    else:
        evidence.clear(spec.name, path)
    evidence.receipt_path(spec.name, path).unlink(missing_ok=True)


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
        return str(p) in recorded  # our entries were merged in

    installed = all(configured(fs, p) for fs, p in files)
    drift = tuple(p for fs, p in files if str(p) in recorded and _drifted(fs, p, recorded[str(p)]))
    return AgentStatus(spec.name, installed, paths, shutil.which(spec.binary), drift,
                       entry.get("base_url"))
