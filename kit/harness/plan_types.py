"""What a plan is: a :class:`Plan` of one :class:`Step` per target file, saying what will
happen to it, the new bytes, the proof that allows it and the backup it needs, and how
``--dry-run`` prints it (lines, a unified diff).

Plain data: :mod:`kit.harness.plan` (install) and :mod:`kit.harness.plan_remove` (removal,
and recovery of an install the manifest has no trusted record of) compute them from the
disk, the manifest and the rendered files, with no write; :mod:`kit.harness.apply` carries
one out. Actions:

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

Action = Literal["create", "overwrite-ours", "overwrite-forced", "merge", "unmerge",
                 "restore-backup", "delete-ours", "leave-alone", "refuse"]


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


def refuse_step(path: Path, old: str | None, e: HarnessError, merged: bool = False,
                new: str | None = None) -> Step:
    """A refused step carrying ``e`` (its message is the step's ``why``, its type what apply
    raises): ``new`` is what we would have written, when known (``harness show`` prints
    it)."""
    return Step(path, "refuse", e.message, old, new, merged=merged, hint=e.hint,
                error=type(e))
