"""The plan of an install: for every target file of the agent, the :class:`Step` that puts
the rendered text there — created, overwritten when provably ours, merged into the user's
own file by key, or refused — with the proof that allows it (:mod:`kit.harness.proof`) and
the backup it needs. Computed from the disk, the manifest and the rendered files, with no
write (the actions are listed in :mod:`kit.harness.plan_types`).

An earlier install the manifest has no trusted record of is first removed as far as it is
provably ours (:func:`kit.harness.plan_remove.plan_remove`, the plan's ``recovery``).
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import HarnessError
from kit.harness import evidence, proof
from kit.harness.files import check_writable, read_text
from kit.harness.merge import content_fingerprint, merge, merged_again
from kit.harness.places import forbidden
from kit.harness.plan_remove import plan_remove
from kit.harness.plan_types import Action, Plan, Step, refuse_step
from kit.harness.spec import FileSpec, HarnessSpec


class EditedFileError(HarnessError):
    """A file mlx-kit wrote was edited since; install will not overwrite the edits."""


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
        if (place := forbidden(step.path)) is not None:
            steps[steps.index(step)] = refuse_step(step.path, step.old, HarnessError(
                f"{step.path}: not a place for an agent's config file ({place})",
                hint=f"check {spec.source or spec.name + ' spec'}'s [config_dir] and "
                "[[files]] path: a spec copied from elsewhere decides where files go"),
                step.merged, step.new)
        elif other is not None:
            steps[steps.index(step)] = refuse_step(step.path, step.old, HarnessError(
                f"{step.path} is {other}'s: `mlx-kit harness install {other}` wrote it",
                hint=f"two agents cannot share a file: give {spec.name}'s file another path, "
                f"or run `mlx-kit harness remove {other}` first"), step.merged, step.new)
        elif step.action != "refuse" and step.changed:
            try:
                check_writable(step.path, through_link=step.merged)
            except HarnessError as e:
                steps[steps.index(step)] = refuse_step(step.path, step.old, e, step.merged,
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
            return refuse_step(path, old, e, merged=True)
        record = {"mode": "merge", "owned": merged_again(prev.get("owned"), owned, fspec.merge),
                  "created_file": prev.get("created_file", old is None),
                  "original_fp": prev.get("original_fp")}
        save = not prev and old is not None  # the user's original, kept once
        if not save and old is not None:  # (a first install keeps them in the backup)
            saved_at = evidence.read_backup_at(backup) if backup else None
            unsaved = proof.dropped_comments(fspec.merge.format, old, new, saved_at,
                                             str(path))[1]
            if unsaved:
                return refuse_step(path, old, proof.comments_refusal(
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
        return refuse_step(path, old, HarnessError(
            f"{path} exists and was not written by mlx-kit",
            hint="move it away, or pass --force to overwrite it"), new=rendered)
    sha = prev.get("sha256")
    if rendered != old and old is not None and proof.edited_since_written(old, sha) \
            and not force:
        return refuse_step(path, old, EditedFileError(
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
