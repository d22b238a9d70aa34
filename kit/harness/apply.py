"""Carrying out a plan (:mod:`kit.harness.plan`): the only code of the harness that writes
into users' config folders.

In an order that leaves no half-written state: a plan with a refused step is refused
whole, before anything is written; every file is checked to hold what the plan saw, and
the manifest's record of the agent to be the one it was computed from (another command
may have run in between); then, under the manifest's lock, per file: the backup of the
user's original, the receipt (before the write: a crash between them leaves evidence
that proves no more than the markers do, never a write with no evidence), the atomic
write, and at the end the manifest record. A removal undoes its steps in reverse order of
install (only the first file written into a new folder records it as created, so that
file goes last, when the others have left the folder empty), then deletes the folders
install created (once empty) and the evidence.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import HarnessError
from kit.harness import evidence, manifest
from kit.harness.files import atomic_write, file_errors, make_parents, read_text, sha256_text
from kit.harness.plan_types import Plan, Step


@dataclass
class Removal:
    """What a removal did: files and folders deleted, user files put back from backups,
    shared files our entries left; ``notes`` says what it left and why (one line each)."""

    removed: list[Path] = field(default_factory=list)
    restored: list[Path] = field(default_factory=list)
    unmerged: list[Path] = field(default_factory=list)  # shared files our entries left
    notes: list[str] = field(default_factory=list)


def _refuse_if_any(plan: Plan) -> None:
    """Raise the first refused step's error (the recovery's first, then in install order)."""
    for step in plan.refusals():
        raise step.error(step.why, hint=step.hint)


def _now(path: Path) -> str | None:
    return read_text(path, errors="replace") if path.is_file() else None


def _check_unchanged(steps: list[Step]) -> None:
    """Every file holds what the plan saw (a text the plan read strictly is valid UTF-8,
    so decoding it leniently gives the same text)."""
    for step in steps:
        if _now(step.path) != step.old:
            raise HarnessError(f"{step.path} changed while mlx-kit was planning its change; "
                               "nothing was written", hint="run the command again")


def _check_entry(plan: Plan, data: dict) -> None:
    if data["agents"].get(plan.agent) != plan.entry:
        raise HarnessError(f"mlx-kit's manifest record of {plan.agent} changed while this "
                           "command was planning (another mlx-kit command ran); nothing "
                           "was written", hint="run the command again")


def install(plan: Plan) -> tuple[list[Path], Removal | None]:
    """Carry out an install plan (its recovery removal first, if any).

    Returns:
        (the files written, the recovery's :class:`Removal` or None)

    Raises:
        HarnessError: a step was refused (``EditedFileError`` for an edited drop-in), a
            file changed since planning, or the file system refused a write.
    """
    _refuse_if_any(plan)
    recovered = None
    if plan.recovery is not None:
        recovered = remove(plan.recovery)
    _check_unchanged(plan.steps)
    written: list[Path] = []
    with file_errors(f"write {plan.agent}'s config"), manifest.editing() as data:
        _check_entry(plan, data)
        recorded = {f["path"]: f for f in (data["agents"].get(plan.agent) or {}).get(
            "files", [])}
        files = [_install_step(plan.agent, step, written) for step in plan.steps]
        # Files recorded at other paths (the agent's config dir moved, e.g. through its env
        # var) stay recorded while they exist, so `remove` still finds them.
        paths = {f["path"] for f in files}
        files += [f for p, f in recorded.items() if p not in paths and Path(p).is_file()]
        data["agents"][plan.agent] = {"base_url": plan.base_url, "installed_at": time.time(),
                                      "files": files}
    return written, recovered


def _install_step(agent: str, step: Step, written: list[Path]) -> dict:
    """Back up, receipt, write one file; returns its manifest record."""
    backup = step.backup
    if step.save_backup:
        backup = evidence.save_backup(agent, step.path, step.old)
    created = list(step.created_dirs)
    if step.changed:
        created += [str(p) for p in make_parents(step.path)]
    sha = sha256_text(step.new)
    evidence.write_receipt(agent, step.path, existed=step.existed, created_dirs=created,
                           install_id=step.install_id, sha256=sha)
    if step.changed:
        atomic_write(step.path, step.new, through_link=step.merged)
        written.append(step.path)
    return {"path": str(step.path), "sha256": sha, "created_dirs": created,
            "backup": str(backup) if backup else None, "install_id": step.install_id,
            **step.record}


def remove(plan: Plan) -> Removal:
    """Carry out a removal plan.

    Raises:
        HarnessError: a step was refused (edited, unmarked, read-only, unparseable), a
            file changed since planning, or the file system refused a change.
    """
    _refuse_if_any(plan)
    _check_unchanged(plan.steps)
    result = Removal(notes=plan.notes())
    with file_errors(f"remove {plan.agent}'s config"), manifest.editing() as data:
        _check_entry(plan, data)
        for step in reversed(plan.steps):
            _remove_step(plan.agent, step, result)
        data["agents"].pop(plan.agent, None)
    evidence.prune(plan.agent)
    return result


def _remove_step(agent: str, step: Step, result: Removal) -> None:
    path = step.path
    if step.action == "delete-ours":
        path.unlink()
        result.removed.append(path)
    elif step.action == "unmerge":
        atomic_write(path, step.new, through_link=True)
        result.unmerged.append(path)
    elif step.action == "restore-backup" and step.merged:
        # copyfile keeps the file's own mode, and writes through a link (the user's)
        shutil.copyfile(step.backup, path)
        result.unmerged.append(path)
    elif step.action == "restore-backup":  # a drop-in a forced install replaced
        if step.old is not None:
            path.unlink()
            result.removed.append(path)
        shutil.move(str(step.backup), path)  # the user's own file, as it was
        result.restored.append(path)
    for folder in sorted(map(Path, step.created_dirs), key=lambda p: -len(p.parts)):
        try:
            folder.rmdir()  # only if empty: never delete what the user put there
            result.removed.append(folder)
        except OSError:
            pass
    if not step.keep_backup:
        evidence.clear(agent, path)
    evidence.receipt_path(agent, path).unlink(missing_ok=True)
