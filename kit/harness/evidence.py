"""What mlx-kit keeps beside each file it writes, in ``<data dir>/backups/<agent>/``, so a
removal can prove what is its own even when the manifest is gone:

- ``<id>-<name>``: the user's own file as it was before install (merge mode, or a file a
  forced install replaced), byte for byte, with its mode;
- ``<id>-<name>.receipt.json``: ``{"path", "existed", "created_dirs", "install_id",
  "sha256"}``: whether the file existed before our first install, the folders that install
  created, an id of that install and the hash of what the last install wrote, both of
  which the manifest's record of the file repeats (a record that differs is from another
  install or an older generation: stale, not trusted).

``<id>`` is a hash of the file's path, so both are found from the agent's spec alone.
Both are deleted when the agent is removed, and so are the folders once empty.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from kit.harness.files import atomic_write, sha256_text
from kit.paths import data_dir


def _root() -> Path:
    return data_dir() / "backups"


def backup_path(agent: str, path: Path) -> Path:
    """Where the user's original of ``path`` is kept (it may not exist)."""
    return _root() / agent / f"{sha256_text(str(path))[:12]}-{path.name}"


def receipt_path(agent: str, path: Path) -> Path:
    backup = backup_path(agent, path)
    return backup.with_name(backup.name + ".receipt.json")


def save_backup(agent: str, path: Path, text: str) -> Path:
    """Keep the user's ``text`` of ``path`` (with the file's mode). Returns the backup."""
    backup = backup_path(agent, path)
    backup.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(backup, text)
    shutil.copymode(path, backup)
    return backup


def new_install_id() -> str:
    return uuid.uuid4().hex


def write_receipt(agent: str, path: Path, *, existed: bool, created_dirs: list[str],
                  install_id: str, sha256: str) -> None:
    """Record, beside the backups, what our first install of ``path`` found and did."""
    receipt = receipt_path(agent, path)
    receipt.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(receipt, json.dumps({"path": str(path), "existed": existed,
                                      "created_dirs": created_dirs,
                                      "install_id": install_id, "sha256": sha256}) + "\n",
                 mode=0o600)


def read_receipt(agent: str, path: Path) -> dict[str, Any] | None:
    """The receipt of ``path``, or None when there is none or it cannot be read (a receipt
    that does not parse proves nothing)."""
    try:
        data = json.loads(receipt_path(agent, path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("path") != str(path) \
            or not isinstance(data.get("existed"), bool) \
            or not isinstance(data.get("created_dirs", []), list):
        return None
    return data


def read_backup(agent: str, path: Path) -> str | None:
    """The user's original text of ``path``, or None."""
    return read_backup_at(backup_path(agent, path))


def read_backup_at(backup: Path) -> str | None:
    """The text of the backup file ``backup``, or None (absent, unreadable, not UTF-8)."""
    try:
        return backup.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def clear(agent: str, path: Path) -> None:
    """Forget ``path``'s backup and receipt; drop the backups folders once empty."""
    backup_path(agent, path).unlink(missing_ok=True)
    receipt_path(agent, path).unlink(missing_ok=True)
    prune(agent)


def prune(agent: str) -> None:
    """Delete ``backups/<agent>`` and ``backups`` when empty (and the data dir itself when
    nothing else of mlx-kit's is in it)."""
    root = _root()
    for folder in (root / agent, root, root.parent):
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue
        except OSError:  # not empty: keep it (and the folders above it)
            return
