"""The plan of an install or a removal: for every target file, what will happen to it, the
new bytes, the proof that allows it (:mod:`kit.harness.proof`) and the backup it needs.

Plans are plain data computed from the disk, the manifest and the rendered files, with no
write; :mod:`kit.harness.apply` carries one out, ``--dry-run`` prints it. Actions:

=================  ========================================================================
create             a file of ours where none is (a drop-in, or a shared file we start)
overwrite-ours     a drop-in carrying our marker (and, when recorded, our last hash)
overwrite-forced   ``--force``: a file that is not ours, backed up first
merge              our entries into the user's file by key (the rest stays as it is)
unmerge            our entries taken out of the user's file
restore-backup     the user's original bytes put back (a merged file, or a forced drop-in)
delete-ours        a file only we wrote (a drop-in, or a shared file we created)
leave-alone        nothing to write (already as planned, not ours, or not there)
refuse             the change would cost the user bytes: the command stops, nothing written
=================  ========================================================================
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kit.errors import HarnessError
from kit.harness import evidence, proof
from kit.harness.files import check_writable, read_text
from kit.harness.formats import loads
from kit.harness.merge import content_fingerprint, merge, merged_again, unmerge
from kit.harness.spec import FileSpec, HarnessSpec

Action = Literal["create", "overwrite-ours", "overwrite-forced", "merge", "unmerge",
                 "restore-backup", "delete-ours", "leave-alone", "refuse"]


class EditedFileError(HarnessError):
    """A file mlx-kit wrote was edited since; install will not overwrite the edits."""


@dataclass
class Step:
    """One target file's part of a plan.

    ``old``/``new`` are the file's text before and after (None: no file). ``backup`` is
    where the user's original is kept: install saves ``old`` there when ``save_backup``;
    removal restores from it, or keeps it when ``keep_backup`` (named in ``notes``).
    ``record`` is what install records of a merged file in the manifest (our entries'
    fingerprints, the user's values replaced, ...); ``created_dirs`` the folders an
    earlier install created (removal deletes them once empty; install adds those it
    makes). A ``refuse`` step carries the error to raise (``why`` is its
    message, ``hint`` its hint).
    """

    path: Path
    action: Action
    why: str
    old: str | None
    new: str | None
    merged: bool = False  # the user's own file, our entries merged in (not a drop-in)
    backup: Path | None = None
    save_backup: bool = False
    keep_backup: bool = False
    install_id: str | None = None  # install: the id its receipt and record carry
    record: dict[str, Any] = field(default_factory=dict)  # install, merged: what we own
    existed: bool = False  # install: the user had a file here before our first install
    created_dirs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what planning left, and why
    kept_note: str | None = None  # removal: the backup kept, and why
    hint: str | None = None
    error: type[HarnessError] = HarnessError

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def diff(self) -> str:
        """The step as a unified diff, usable as a patch: ``/dev/null`` for a file created
        or deleted, lines split at ``\n`` only (a ``\r`` or U+2028 is a line's content),
        and a last line without a newline marked as ``diff -u`` marks it."""
        if self.action == "refuse":
            return ""
        out = difflib.unified_diff(
            _lines(self.old or ""), _lines(self.new or ""),
            fromfile=str(self.path) if self.old is not None else "/dev/null",
            tofile=str(self.path) if self.new is not None else "/dev/null")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of "
                       "file\n" for line in out)

    def describe(self) -> str:
        """One line: ``<action> <path>: <why>`` (+ the hint of a refusal)."""
        return f"{self.action} {self.path}: {self.why}" + (f" ({self.hint})" if self.hint else "")


@dataclass
class Plan:
    """Every change of one install or removal of ``agent``, in the order install writes
    them (removal applies its steps in reverse). ``entry`` is the manifest's record of the
    agent the plan was computed from (apply refuses to go on if it changed since).
    An install that found an earlier install the manifest has no trusted record of first
    runs ``recovery``, the removal of what is provably ours; its steps saw the files as
    that removal leaves them."""

    agent: str
    kind: Literal["install", "remove"]
    steps: list[Step]
    entry: dict[str, Any] | None
    base_url: str | None = None
    baked_source: str | None = None
    recovery: Plan | None = None

    def refusals(self) -> list[Step]:
        """The refused steps, the recovery's first."""
        return (self.recovery.refusals() if self.recovery else []) + [
            s for s in self.steps if s.action == "refuse"]

    def describe(self) -> list[str]:
        """One line per step and note, as ``--dry-run`` prints them (a file that is not
        there and stays so is left out)."""
        lines = []
        if self.recovery is not None:
            lines += [f"an earlier install the manifest did not record: {line}"
                      for line in self.recovery.describe()]
        return lines + [s.describe() for s in self.steps if s.old is not None
                        or s.new is not None or s.action != "leave-alone"] + self.notes()

    def notes(self) -> list[str]:
        """What the plan leaves and why: planning's notes in order, then the backups kept
        (in the order removal applies its steps)."""
        return [n for s in self.steps for n in s.notes] + [
            s.kept_note for s in reversed(self.steps) if s.kept_note]

    def diff(self) -> str:
        """Every changed file's unified diff, the recovery's first."""
        steps = (self.recovery.steps if self.recovery else []) + self.steps
        return "".join(s.diff() for s in steps if s.changed)


def _lines(text: str) -> list[str]:
    """``text``'s lines, each with its ``\n`` (``str.splitlines`` also splits at ``\r``,
    U+2028 and others, which would make the diff no patch of the file)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _refuse(path: Path, old: str | None, e: HarnessError, merged: bool = False,
            new: str | None = None) -> Step:
    """A refused step: ``new`` is what we would have written, when known (``harness show``
    prints it)."""
    return Step(path, "refuse", e.message, old, new, merged=merged, hint=e.hint,
                error=type(e))


# --- install -------------------------------------------------------------------------------

def plan_install(spec: HarnessSpec, rendered: dict[str, str], entry: dict | None, *,
                 force: bool = False, base_url: str | None = None,
                 baked_source: str | None = None,
                 claims: dict[str, tuple[str, bool]] | None = None) -> Plan:
    """What installing ``rendered`` (template path -> text) for ``spec`` would change,
    given the manifest's record of the agent (``entry``; None: none) and ``claims``, the
    paths of its files that other agents' installs wrote (path -> (agent, merges?)): a
    file of another agent's is refused, ``--force`` or not (:func:`proof.shared_with`).

    Raises:
        OSError: a target cannot be read (the caller names the agent).
    """
    recovery = None
    if proof.lost_install(spec, entry):
        recovery = plan_remove(spec, entry, claims=claims)
        entry = None  # the removal drops the agent's record
    after = {str(s.path): s.new for s in (recovery.steps if recovery else [])}
    recorded = {f["path"]: f for f in (entry or {}).get("files", [])}
    steps = []
    for fspec, path in spec.file_paths():
        old = after[str(path)] if str(path) in after else (
            read_text(path) if path.is_file() else None)
        steps.append(_install_step(spec, fspec, path, old, rendered[fspec.path],
                                   recorded.get(str(path), {}), force))
    for step in steps:  # the folder and permissions of every file we would write
        other = proof.shared_with(spec.name, step.merged, (claims or {}).get(str(step.path)))
        if other is not None:
            steps[steps.index(step)] = _refuse(step.path, step.old, HarnessError(
                f"{step.path} is {other}'s: `mlx-kit harness install {other}` wrote it",
                hint=f"two agents cannot share a file: give {spec.name}'s file another path, "
                f"or run `mlx-kit harness remove {other}` first"), step.merged, step.new)
        elif step.action != "refuse" and step.changed:
            try:
                check_writable(step.path, through_link=step.merged)
            except HarnessError as e:
                steps[steps.index(step)] = _refuse(step.path, step.old, e, step.merged,
                                                   step.new)
    return Plan(spec.name, "install", steps, entry, base_url=base_url,
                baked_source=baked_source, recovery=recovery)


def _install_step(spec: HarnessSpec, fspec: FileSpec, path: Path, old: str | None,
                  rendered: str, prev: dict, force: bool) -> Step:
    install_id = prev.get("install_id") or evidence.new_install_id()
    backup = Path(prev["backup"]) if prev.get("backup") else None
    created = list(prev.get("created_dirs", []))  # folders our first install made
    if fspec.merge is not None:  # the file is the user's; only our entries change
        try:
            new, owned = merge(fspec.merge, old, rendered, str(path))
        except HarnessError as e:  # not parseable, or not the shape the agent uses
            return _refuse(path, old, e, merged=True)
        record = {"mode": "merge", "owned": merged_again(prev.get("owned"), owned),
                  "created_file": prev.get("created_file", old is None),
                  "original_fp": prev.get("original_fp")}
        save = not prev and old is not None  # the user's original, kept once
        if not save and old is not None:  # (a first install keeps them in the backup)
            saved_at = evidence.read_backup_at(backup) if backup else None
            unsaved = proof.dropped_comments(fspec.merge.format, old, new, saved_at,
                                             str(path))[1]
            if unsaved:
                return _refuse(path, old, proof.comments_refusal(
                    path, fspec.merge.format, unsaved, "merging"), merged=True, new=new)
        if save:
            backup = evidence.backup_path(spec.name, path)
            record["original_fp"] = content_fingerprint(fspec.merge, old, str(path))
        keys = ", ".join(fspec.merge.owns) or f"entries by {fspec.merge.key}"
        action: Action = "create" if old is None else "merge" if new != old else "leave-alone"
        why = (f"a new file holding only our entries ({keys})" if old is None else
               f"our entries ({keys}); every other byte of your file stays" if new != old
               else "already holds our entries")
        if save:
            why += f"; your file is backed up first to {backup}"
        return Step(path, action, why, old, new, merged=True, backup=backup, save_backup=save,
                    install_id=install_id, record=record, created_dirs=created,
                    existed=not record["created_file"])
    ours = old is not None and proof.is_ours(old)
    if old is not None and not ours and not force:
        return _refuse(path, old, HarnessError(
            f"{path} exists and was not written by mlx-kit",
            hint="move it away, or pass --force to overwrite it"), new=rendered)
    sha = prev.get("sha256")
    if rendered != old and old is not None and proof.edited_since_written(old, sha) \
            and not force:
        return _refuse(path, old, EditedFileError(
            f"{path} was edited since mlx-kit wrote it; not overwriting your edits",
            hint="pass --force to regenerate it"), new=rendered)
    save = old is not None and not ours  # forced: keep the user's file
    if save:
        backup = evidence.backup_path(spec.name, path)
    if old is None:
        action, why = "create", "no file there"
    elif not ours:
        action, why = "overwrite-forced", f"--force; your file is backed up to {backup}"
    else:
        action = "overwrite-ours" if rendered != old else "leave-alone"
        why = "carries mlx-kit's marker" + (
            " and the hash mlx-kit recorded" if sha and not proof.edited_since_written(old, sha)
            else "") + ("" if rendered != old else "; already as planned")
    return Step(path, action, why, old, rendered, backup=backup, save_backup=save,
                install_id=install_id, existed=save or bool(backup), created_dirs=created)


# --- remove --------------------------------------------------------------------------------

def plan_remove(spec: HarnessSpec, entry: dict | None, *, force: bool = False,
                claims: dict[str, tuple[str, bool]] | None = None) -> Plan:
    """What removing ``spec``'s files would change, given the manifest's record of the
    agent (``entry``). A file whose record is trusted (:func:`proof.trusted`) goes by it;
    any other by the markers and the evidence beside the backups (:func:`_recover_step`),
    except one of another agent's (``claims``, as for :func:`plan_install`): left alone.

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
    elif step.action == "leave-alone":  # not used: the only copy of their earlier file
        step.keep_backup = True
        step.kept_note = (f"kept your file from before mlx-kit's install of {step.path} at "
                          f"{step.backup}")
    return step


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
            return _refuse(path, old, e, merged=True)
        why = "our entries by the fingerprints recorded at install (manifest record trusted)"
        original = evidence.read_backup_at(backup) if backup else None
        restore = proof.restores_original(m, old, text, original, f.get("original_fp"),
                                          f.get("sha256"), str(path))
        saved, unsaved = ([], []) if restore else proof.dropped_comments(
            m.format, old, text, original, str(path))
        if unsaved:
            return _refuse(path, old, proof.comments_refusal(path, m.format, unsaved,
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
        return _refuse(path, old, e)
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
            return _refuse(path, old, e)
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
        return _refuse(path, old, e, merged=True)
    why = "our marked entries, and the receipt of our install"
    restore = backup_text is not None and proof.restores_original(
        m, old, text, backup_text, content_fingerprint(m, backup_text, "the backup"),
        (receipt or {}).get("sha256"), str(path))
    saved, unsaved = ([], []) if restore else proof.dropped_comments(
        m.format, old, text, backup_text, str(path))
    if unsaved:
        return _refuse(path, old, proof.comments_refusal(path, m.format, unsaved, "removing"),
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
