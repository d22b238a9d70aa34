"""The manifest: what mlx-kit wrote where, so removal undoes exactly that.

Stored as JSON in the data dir (``manifest.json``), guarded by a file lock::

    {"version": 1, "agents": {"pi": {"base_url": ..., "installed_at": ...,
        "files": [{"path": ..., "sha256": ..., "created_dirs": [...]}]}}}
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock

from kit.errors import HarnessError
from kit.harness.files import atomic_write
from kit.paths import data_dir


def manifest_path() -> Path:
    return data_dir() / "manifest.json"


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"version": 1, "agents": {}}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise HarnessError(f"the manifest {path} is corrupt: {e}",
                           hint="move it aside; `harness remove` then works from file markers") from None
    if not isinstance(data, dict) or not isinstance(data.setdefault("agents", {}), dict) or any(
            not isinstance(a, dict) or not isinstance(a.get("files", []), list)
            or not all(isinstance(f, dict) and "path" in f for f in a.get("files", []))
            for a in data["agents"].values()):
        raise HarnessError(f"the manifest {path} is corrupt: unexpected structure",
                           hint="move it aside; `harness remove` then works from file markers")
    return data


def read() -> dict[str, Any]:
    """The manifest's current content (no lock held)."""
    return _read(manifest_path())


@contextmanager
def editing() -> Iterator[dict[str, Any]]:
    """Lock the manifest, yield its data for editing, write it back atomically."""
    path = manifest_path()
    with FileLock(str(path) + ".lock", timeout=30):
        data = _read(path)
        yield data
        atomic_write(path, json.dumps(data, indent=2) + "\n")
