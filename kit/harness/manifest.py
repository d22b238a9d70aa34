"""The manifest: what mlx-kit wrote where, so removal undoes exactly that.

Stored as JSON in the data dir (``manifest.json``), guarded by a file lock::

    {"version": 1, "agents": {"pi": {"base_url": ..., "installed_at": ...,
        "files": [{"path": ..., "sha256": ..., "created_dirs": [...],
                   "install_id": ...}]}}}

Each write replaces the file atomically and first keeps the generation it replaces as
``manifest.json.prev``; a read falls back to that one when the current file is unreadable
(corrupt, truncated, garbage). When neither can be read, the read commands go on with an
empty manifest (a warning on stderr) and :func:`editing` moves the broken file aside
(``manifest.json.broken-<time>``, kept for the user) and starts a fresh one: removal then
works from the markers in the files and the evidence in the backups folder
(:mod:`kit.harness.evidence`), never from a guess. Once no agent is recorded, the
manifest, its previous generation and its lock file are deleted (no litter).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from kit.errors import HarnessError
from kit.harness.files import atomic_write
from kit.harness.spec_errors import dotted
from kit.paths import data_dir

#: Warnings already printed by this process (each once).
_warned: set[str] = set()


def manifest_path() -> Path:
    return data_dir() / "manifest.json"


def previous_path() -> Path:
    return manifest_path().with_name("manifest.json.prev")


def _lock_path() -> Path:
    return manifest_path().with_name("manifest.json.lock")


def warn(message: str) -> None:
    """Print ``warning: <message>`` on stderr, once per process (the read commands and
    launch go on after it)."""
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr)


def _empty() -> dict[str, Any]:
    return {"version": 1, "agents": {}}


# The manifest's shape, checked on every read: the harness code indexes into these records
# (owned["entries"].items(), Path(backup), ...), so a record of the wrong type must make
# the manifest unreadable (removal then works from the markers and backups), never a
# crash of every harness command. Unknown keys are allowed: a newer mlx-kit may add some.
class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Owned(_Record):
    entries: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    created: list[StrictStr] = Field(default_factory=list)
    previous: dict[StrictStr, Any] = Field(default_factory=dict)


class _File(_Record):
    path: StrictStr
    sha256: Optional[StrictStr] = None
    created_dirs: list[StrictStr] = Field(default_factory=list)
    backup: Optional[StrictStr] = None
    install_id: Optional[StrictStr] = None
    mode: Optional[StrictStr] = None
    owned: Optional[_Owned] = None
    created_file: Optional[StrictBool] = None
    original_fp: Optional[StrictStr] = None


class _Agent(_Record):
    base_url: Optional[StrictStr] = None
    installed_at: Optional[float] = None
    files: list[_File] = Field(default_factory=list)


class _Manifest(_Record):
    agents: dict[StrictStr, _Agent] = Field(default_factory=dict)


def _parse(path: Path) -> dict[str, Any]:
    """The manifest at ``path``.

    Raises:
        HarnessError: it is not the manifest's JSON structure (FileNotFoundError: absent).
    """
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise HarnessError(f"the manifest {path} is corrupt: {str(e)[:120]}") from None
    try:
        _Manifest.model_validate(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = dotted(tuple(first["loc"])) or "the top level"
        problem = first["msg"].split(" or instance of ")[0].lower()
        raise HarnessError(f"the manifest {path} is corrupt: unexpected structure at "
                           f"{where}: {problem}") from None
    data.setdefault("agents", {})
    return data


def load() -> tuple[dict[str, Any], str | None]:
    """The manifest's content (no lock held), with what went wrong reading it.

    Returns:
        (the data, None) when the current file is readable or absent (absent: empty);
        (the previous generation's data, a warning) when only that one is readable;
        (an empty manifest, a warning) when neither is.
    """
    path, prev = manifest_path(), previous_path()
    try:
        return _parse(path), None
    except FileNotFoundError:
        if not prev.is_file():
            return _empty(), None
        problem = f"the manifest {path} is missing"  # .prev exists only beside a manifest
    except HarnessError as e:
        problem = e.message
    try:
        return _parse(prev), f"{problem}; using its previous generation {prev}"
    except (FileNotFoundError, HarnessError):
        return _empty(), (f"{problem}; going on without it (removal works from the file "
                          "markers and mlx-kit's backups)")


def read() -> dict[str, Any]:
    """The manifest's current content (no lock held). A manifest that cannot be read is
    warned about on stderr (see :func:`load`), never an error."""
    data, warning = load()
    if warning:
        warn(warning)
    return data


def _keep_aside(path: Path) -> Path:
    """Move an unreadable manifest out of the way, for the user to look at."""
    aside = path.with_name(f"manifest.json.broken-{time.strftime('%Y%m%dT%H%M%S')}")
    os.replace(path, aside)
    return aside


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


@contextmanager
def editing() -> Iterator[dict[str, Any]]:
    """Lock the manifest, yield its data for editing, write it back atomically (keeping
    the replaced generation as ``manifest.json.prev``). An unreadable manifest is moved
    aside (and said so on stderr) and editing starts from the previous generation or from
    an empty manifest. With no agent left, the manifest files and the lock are deleted."""
    path, prev, lock_path = manifest_path(), previous_path(), _lock_path()
    made = _missing_folders(path.parent)  # deepest first
    path.parent.mkdir(parents=True, exist_ok=True)  # the lock lives there
    with FileLock(str(lock_path), timeout=30):
        data, warning = load()
        if warning and path.is_file():
            aside = _keep_aside(path)
            warn(f"{warning}; the unreadable file is kept as {aside}")
        elif warning:
            warn(warning)
        yield data
        if not data["agents"]:
            path.unlink(missing_ok=True)
            prev.unlink(missing_ok=True)
        else:
            if path.is_file():  # the generation we replace (readable: load() said so)
                atomic_write(prev, path.read_bytes().decode("utf-8"), mode=0o600)
            atomic_write(path, json.dumps(data, indent=2) + "\n", mode=0o600)
    if not data["agents"]:
        # The lock file goes too: a process that waited on it holds a lock on the unlinked
        # file, so two editors may overlap once, at the moment the last agent is removed
        # (filelock offers no safe delete; an empty manifest is the worst outcome).
        lock_path.unlink(missing_ok=True)
        for folder in made:  # made only for the lock: leave a fresh HOME as it was
            try:
                folder.rmdir()  # refused when anything else is in it
            except OSError:
                break
