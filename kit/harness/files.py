"""Safe file writes: atomic replace, created-folder tracking.

``os.replace`` of a temp file in the same folder is atomic on POSIX and Windows; no library
in our stack offers "write text atomically + tell me which parent folders you created".
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_text(path: Path, errors: str = "strict") -> str:
    """A file's text exactly as stored: UTF-8, line endings untranslated (``Path.read_text``
    turns ``\r\n`` into ``\n``, so a CRLF file would not come back byte for byte)."""
    return path.read_bytes().decode("utf-8", errors)


def make_parents(path: Path) -> list[Path]:
    """Create ``path``'s missing parent folders. Returns those created, outermost first."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        folder.mkdir()
    return list(reversed(missing))


def atomic_write(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        elif path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
