"""Removal: undo what install did for an agent, touching only bytes proved ours.

With a trusted manifest record (its install id and last-written hash match the receipt
beside the backups) a file is handled by that record: delete what still matches, take our
entries out of a shared file, put back the user's values and original bytes. Without one
(:mod:`kit.harness.recover`) only what carries our marker or is proved ours by the backups
is touched. Every file is checked before any is changed; then the backups, receipts and
folders install created go (once empty).
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import HarnessError
from kit.harness import comments, evidence, manifest, recover
from kit.harness.files import atomic_write, check_writable, read_text, sha256_text
from kit.harness.merge import content_fingerprint, unmerge
from kit.harness.recover import is_ours as _is_ours
from kit.harness.spec import FileSpec, HarnessSpec


def trusted(agent: str, f: dict) -> bool:
    """Whether a manifest record of a file is from the install that the evidence beside
    the backups describes (a record restored from another install is stale)."""
    receipt = evidence.read_receipt(agent, Path(f["path"]))
    if "install_id" not in f:  # recorded before receipts existed
        return receipt is None
    return receipt is not None and receipt.get("install_id") == f["install_id"] \
        and receipt.get("sha256") == f.get("sha256")


@contextmanager
def file_errors(action: str):
    """Report a file-system failure (read-only folder, permissions) as a HarnessError."""
    try:
        yield
    except OSError as e:
        raise HarnessError(f"cannot {action}: {e.strerror or e}"
                           + (f": {e.filename}" if e.filename else ""),
                           hint="check the folder's permissions") from None


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
    merged: bool = False  # the user's own file, our entries merged in (not a drop-in)


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
    with file_errors(f"remove {spec.name}'s config"), manifest.editing() as data:
        entry = data["agents"].get(spec.name) or {}
        recorded = {f["path"]: f for f in entry.get("files", [])}
        fspecs = {str(p): fs for fs, p in spec.file_paths()}
        steps = []
        for p in list(recorded) + [p for p in fspecs if p not in recorded]:
            f = recorded.get(p)
            if f is not None and trusted(spec.name, f):
                steps.append(_planned(f, fspecs.get(p), force))
                continue
            if f is not None:
                result.notes.append(f"the manifest's record of {p} is from another install; "
                                    "worked from the file's markers and mlx-kit's backups")
            steps.append(_recovered(spec, fspecs.get(p), Path(p), result.notes, force))
        # All checked above, before anything was changed. Undone in reverse order of
        # install: only the first file written into a new folder records it as created, so
        # that file goes last, when the others have left the folder empty.
        for step in reversed(steps):
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
               notes: list[str], force: bool) -> _Step:
    """A removal step with no trusted record: from the markers and the evidence."""
    step = _Step(path, "none", backup=evidence.backup_path(spec.name, path),
                 created_dirs=recover.created_dirs(spec, path))
    if fspec is not None and fspec.merge is not None:
        step.merged = True
        (step.action, arg), more = recover.plan_merged(spec, fspec, path, force)
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
    if is_empty and f.get("created_file") and not comments.comments(fspec.merge.format, text):
        return "delete", None  # ours alone: a comment the user wrote in it keeps the file
    backup = Path(f["backup"]) if f.get("backup") else None
    if backup and backup.is_file() and f.get("original_fp") == content_fingerprint(
            fspec.merge, text, str(path)) and restorable(
                fspec.merge.format, current, text, backup, f.get("sha256")):
        return "restore", None  # same content as before install: put the exact bytes back
    return ("write", text) if text != current else ("none", None)


def restorable(fmt: str, current: str, unmerged: str, backup: Path,
               written_sha: str | None) -> bool:
    """Whether putting the backup's exact bytes back loses nothing of the user's, given the
    content without our entries equals the backup's: the file is untouched since we wrote
    it (its hash is ``written_sha``), or what is left holds no comment the backup lacks (an
    agent that rewrote the file reformats it but adds no comments; a user's comment added
    since install is their bytes, kept by writing ``unmerged`` instead)."""
    if written_sha and sha256_text(current) == written_sha:
        return True
    try:
        before = backup.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return not comments.added(fmt, unmerged, before)


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
    # A drop-in a forced install replaced: put the user's file back. A merged file the
    # user deleted since install stays deleted (its backup is kept and named, below).
    if step.backup and step.backup.is_file() and not path.exists() and not step.merged:
        shutil.move(str(step.backup), path)  # the user's own file, as it was
        result.restored.append(path)
    for folder in sorted(map(Path, step.created_dirs), key=lambda p: -len(p.parts)):
        try:
            folder.rmdir()  # only if empty: never delete what the user put there
            result.removed.append(folder)
        except OSError:
            pass
    kept = step.backup if step.backup and step.backup.is_file() else None
    if kept and step.merged and not path.exists():
        result.notes.append(f"{path} was deleted since mlx-kit's install and stays deleted; "
                            f"your file from before that install is kept at {kept}")
    elif kept and step.action == "none":  # not used: the only copy of their earlier file
        result.notes.append(f"kept your file from before mlx-kit's install of {path} at "
                            f"{kept}")
    else:
        evidence.clear(spec.name, path)
    evidence.receipt_path(spec.name, path).unlink(missing_ok=True)
