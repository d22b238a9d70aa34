"""The plan of a removal: for every file of the agent, the :class:`Step` that takes out
what is ours — a trusted manifest record goes by its fingerprints and hashes
(:func:`_recorded_step`); a file with none by its markers and the evidence beside the
backups (:func:`_recover_step`, also the recovery an install runs first) — and the fate of
each backup (restored, kept and named, or dropped). Writes nothing.
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import HarnessError
from kit.harness import evidence, proof
from kit.harness.files import check_writable, read_text
from kit.harness.formats import loads
from kit.harness.merge import content_fingerprint, unmerge
from kit.harness.plan_types import Plan, Step, refuse_step
from kit.harness.spec import FileSpec, HarnessSpec


def plan_remove(spec: HarnessSpec, entry: dict | None, *, force: bool = False,
                claims: dict[str, tuple[str, bool]] | None = None) -> Plan:
    """What removing ``spec``'s files would change, given the manifest's record of the
    agent (``entry``). A file whose record is trusted (:func:`proof.trusted`) goes by it;
    any other by the markers and the evidence beside the backups (:func:`_recover_step`),
    except one of another agent's (``claims``, as for
    :func:`kit.harness.plan.plan_install`): left alone.

    Raises:
        OSError: a target cannot be read.
    """
    recorded = {f["path"]: f for f in (entry or {}).get("files", [])}
    fspecs = {str(p): fs for fs, p in spec.file_paths()}
    steps = []
    for p in list(recorded) + [p for p in fspecs if p not in recorded]:
        f = recorded.get(p)
        if f is not None and proof.trusted(spec.name, f):
            step = _recorded_step(f, fspecs.get(p), force)
        elif (other := proof.shared_with(spec.name, False, (claims or {}).get(p))):
            text = read_text(Path(p), errors="replace") if Path(p).is_file() else None
            step = Step(Path(p), "leave-alone", f"{other}'s file", text, text, notes=[
                f"left {p}: `mlx-kit harness install {other}` wrote it"])
        else:
            step = _recover_step(spec, fspecs.get(p), Path(p), force)
            if f is not None:
                step.notes.insert(0, f"the manifest's record of {p} is from another "
                                  "install; worked from the file's markers and mlx-kit's "
                                  "backups")
        steps.append(_backup_fate(step))
    return Plan(spec.name, "remove", steps, entry)


def _backup_fate(step: Step) -> Step:
    """Restore a forced drop-in's backup where nothing is left, or keep (and name) a backup
    that is the only copy of the user's earlier file; every other backup goes."""
    if step.action == "refuse" or step.backup is None or not step.backup.is_file():
        return step
    # nothing at the path once the step is done (a folder there is something)
    gone = step.new is None and (step.action == "delete-ours" or not step.path.exists())
    if gone and not step.merged:  # a drop-in a forced install replaced
        step.action, step.new = "restore-backup", evidence.read_backup_at(step.backup)
        step.why += "; your file from before mlx-kit's install comes back from its backup"
    elif gone:
        step.keep_backup = True
        step.kept_note = (f"{step.path} was deleted since mlx-kit's install and stays "
                          f"deleted; your file from before that install is kept at "
                          f"{step.backup}")
    elif step.action == "leave-alone" and not _same_bytes(step.path, step.backup):
        # not used: the only copy of their earlier file (the same bytes at the path are
        # a copy already: the backup then goes like any other)
        step.keep_backup = True
        step.kept_note = (f"kept your file from before mlx-kit's install of {step.path} at "
                          f"{step.backup}")
    return step


def _same_bytes(path: Path, backup: Path) -> bool:
    """Whether ``path`` is a file holding exactly ``backup``'s bytes."""
    try:
        return path.is_file() and path.read_bytes() == backup.read_bytes()
    except OSError:
        return False


def _recorded_step(f: dict, fspec: FileSpec | None, force: bool) -> Step:
    """A removal step from a trusted manifest record."""
    path = Path(f["path"])
    backup = Path(f["backup"]) if f.get("backup") else None
    merged = f.get("mode") == "merge"
    old = read_text(path, errors="strict" if merged else "replace") if path.is_file() else None
    base = dict(backup=backup, created_dirs=list(f.get("created_dirs", [])))
    if merged:
        if old is None or fspec is None or fspec.merge is None:
            return Step(path, "leave-alone", "not there" if old is None else
                        "no longer one of the agent's files", old, old, merged=True, **base)
        m = fspec.merge
        try:
            text, is_empty = unmerge(m, old, f["owned"], str(path), force=force)
            check_writable(path, "remove mlx-kit's entries from", through_link=True)
        except HarnessError as e:
            return refuse_step(path, old, e, merged=True)
        why = "our entries by the fingerprints recorded at install (manifest record trusted)"
        original = evidence.read_backup_at(backup) if backup else None
        restore = proof.restores_original(m, old, text, original, f.get("original_fp"),
                                          f.get("sha256"), str(path))
        saved, unsaved = ([], []) if restore else proof.dropped_comments(
            m.format, old, text, original, str(path))
        if unsaved:
            return refuse_step(path, old, proof.comments_refusal(path, m.format, unsaved,
                                                             "removing"), merged=True, new=text)
        if proof.deletable_created_file(m.format, text, is_empty, f.get("created_file")):
            return Step(path, "delete-ours", "install created it and only our entries are "
                        "in it", old, None, merged=True, **base)
        if restore:
            return Step(path, "restore-backup", why + "; what is left equals your file "
                        "from before install, whose exact bytes come back", old, original,
                        merged=True, **base)
        if text == old:
            return Step(path, "leave-alone", "none of our entries is in it", old, old,
                        merged=True, **base)
        return _keeping(Step(path, "unmerge", why, old, text, merged=True, **base), saved,
                        m.format)
    if old is None:
        return Step(path, "leave-alone", "not there", None, None, **base)
    text = old
    try:
        if not proof.is_ours(text) and not force:
            raise HarnessError(f"{path} no longer carries mlx-kit's marker; not removing",
                               hint="pass --force to delete it anyway")
        if proof.edited_since_written(text, f["sha256"]) and not force:
            raise HarnessError(f"{path} was edited since mlx-kit wrote it",
                               hint="pass --force to delete it anyway")
        check_writable(path, "remove")
    except HarnessError as e:
        return refuse_step(path, old, e)
    why = "--force" if force and not proof.is_ours(text) else \
        "carries mlx-kit's marker and the hash mlx-kit recorded"
    return Step(path, "delete-ours", why, old, None, **base)


def _recover_step(spec: HarnessSpec, fspec: FileSpec | None, path: Path,
                  force: bool) -> Step:
    """A removal step with no trusted record: from the markers and the evidence."""
    receipt = evidence.read_receipt(spec.name, path)
    base = dict(backup=evidence.backup_path(spec.name, path),
                created_dirs=[d for d in (receipt or {}).get("created_dirs", [])
                              if isinstance(d, str)])
    merged = fspec is not None and fspec.merge is not None
    old = read_text(path, errors="strict" if merged else "replace") if path.is_file() else None
    if not merged:
        if old is None:
            return Step(path, "leave-alone", "not there", None, None, **base)
        if not proof.is_ours(old):
            return Step(path, "leave-alone", "not ours", old, old, notes=[
                f"left {path}: it does not carry mlx-kit's marker"], **base)
        try:
            check_writable(path, "remove")
        except HarnessError as e:
            return refuse_step(path, old, e)
        return Step(path, "delete-ours", "carries mlx-kit's marker (no trusted manifest "
                    "record)", old, None, **base)
    if old is None:
        return Step(path, "leave-alone", "not there", None, None, merged=True, **base)
    m = fspec.merge
    backup_text = evidence.read_backup(spec.name, path)
    try:
        doc = loads(m.format, old, str(path))
        original = None
        if backup_text is not None:
            try:
                original = loads(m.format, backup_text, "the backup")
            except HarnessError:
                backup_text = None
            else:  # an empty file holds the empty list or mapping the agent's file holds
                original = ([] if m.strategy == "list-by-key" else {}) if original is None \
                    else original
        created_file = backup_text is None and bool(receipt) and not receipt["existed"]
        record, notes = proof.recovered_record(m, doc, proof.ours_fragment(spec, fspec),
                                               original, created_file, receipt is not None,
                                               str(path))
        if not record["entries"]:
            return Step(path, "leave-alone", "nothing provably ours in it", old, old,
                        merged=True, notes=notes, **base)
        if receipt is None and not force:
            # Marked entries but no receipt: what a removal leaves when the user kept a
            # copy of our entry, or what a lost data dir leaves. Only the user can tell.
            return Step(path, "leave-alone", "marked entries but no receipt", old, old,
                        merged=True, notes=notes + [
                            f"left mlx-kit's marked entries in {path} "
                            f"({', '.join(sorted(record['entries']))}): mlx-kit has no "
                            "record of installing them; pass --force to remove them"], **base)
        check_writable(path, "remove mlx-kit's entries from", through_link=True)
        text, is_empty = unmerge(m, old, record, str(path), force=True)
    except HarnessError as e:
        return refuse_step(path, old, e, merged=True)
    why = "our marked entries, and the receipt of our install"
    restore = backup_text is not None and proof.restores_original(
        m, old, text, backup_text, content_fingerprint(m, backup_text, "the backup"),
        (receipt or {}).get("sha256"), str(path))
    saved, unsaved = ([], []) if restore else proof.dropped_comments(
        m.format, old, text, backup_text, str(path))
    if unsaved:
        return refuse_step(path, old, proof.comments_refusal(path, m.format, unsaved, "removing"),
                       merged=True, new=text)
    if restore:
        return Step(path, "restore-backup", why + "; what is left equals your file from "
                    "before install, whose exact bytes come back", old, backup_text,
                    merged=True, notes=notes, **base)
    if proof.deletable_created_file(m.format, text, is_empty, created_file):
        return Step(path, "delete-ours", "the receipt says install created it; only our "
                    "entries are in it", old, None, merged=True, notes=notes, **base)
    return _keeping(Step(path, "unmerge", why, old, text, merged=True, notes=notes, **base),
                    saved, m.format)


def _keeping(step: Step, saved: list[str], fmt: str) -> Step:
    """``step``, keeping its backup when the rewrite loses comments (``saved``) that only
    the backup of the user's original still holds."""
    if saved and step.backup is not None:
        step.keep_backup = True
        step.kept_note = (f"the {fmt} parser could not keep your comment(s) "
                          f"{', '.join(map(repr, saved))} in {step.path}; your file from "
                          f"before mlx-kit's install, which has them, is kept at {step.backup}")
    return step
