"""Images a request names by path, read only inside the folders the user allowed
(``serve --image-dir DIR``): Gemini's ``fileData`` with a local ``fileUri``, and
``file://`` URLs in OpenAI's ``image_url``. Without the flag no request can make the
server read a file (:func:`kit.server.content.media.refuse_file`).

A path is resolved with every symbolic link followed and must then lie inside an allowed
folder (itself resolved when the server starts), so ``..`` and links cannot leave it; the
file is opened without following a link in its last component, must be a regular file,
and is bounded by ``--max-image-bytes`` from its size before a byte is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from kit.errors import ConfigError
from kit.server.errors import APIError


def allowed_folders(dirs: tuple[str, ...] | list[str]) -> tuple[Path, ...]:
    """``--image-dir``'s folders, resolved (links followed, ``~`` expanded).

    Raises:
        ConfigError: a folder does not exist or is not a folder (naming the flag).
    """
    out = []
    for d in dirs:
        path = Path(os.path.expanduser(d))
        if not path.is_dir():
            raise ConfigError(f"--image-dir {d}: not a folder",
                              hint="name an existing folder whose images requests may use")
        out.append(path.resolve())
    return tuple(out)


def local_path(uri: str) -> Path | None:
    """The path of a ``file:`` URL (``file:///a/b.png``, ``file:/a/b.png``; a host other
    than empty or ``localhost`` is not local) or of an absolute or ``~`` path; None for
    anything else (relative paths name no folder the server could know)."""
    if uri[:5].lower() == "file:":
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            return None
        path = unquote(parts.path)
    else:
        path = uri
    path = os.path.expanduser(path)
    return Path(path) if os.path.isabs(path) else None


def read_image_file(uri: str, folders: tuple[Path, ...], limit: int, where: str,
                    bad) -> bytes:
    """The bytes of the image file ``uri`` names, when it lies inside one of ``folders``.

    Args:
        uri: a ``file:`` URL or an absolute path (see :func:`local_path`).
        folders: the allowed folders, resolved (``--image-dir``).
        limit: largest file, bytes (``--max-image-bytes``).
        where: the part's path, for errors.
        bad: ``(where, message, code) -> APIError`` (the media module's).
    Raises:
        APIError: 400 ``unsupported_value`` for a path outside every allowed folder (or
            not local), ``invalid_image`` for a missing, unreadable or non-regular file,
            ``image_too_large`` past ``limit``.
    """
    path = local_path(uri)
    shown = ", ".join(str(f) for f in folders)
    outside = bad(where, f"the image file is not inside a folder this server reads images "
                  f"from (--image-dir: {shown}); send it inline as base64", "unsupported_value")
    if path is None:
        raise outside
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise bad(where, "the image file does not exist or cannot be read",
                  "invalid_image") from None
    if not any(real.is_relative_to(f) for f in folders):
        raise outside
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_NONBLOCK", 0))  # a FIFO must not hang the reader
    except OSError:
        raise bad(where, "the image file does not exist or cannot be read",
                  "invalid_image") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a folder, a FIFO, a device
        os.close(fd)
        raise bad(where, "the image path is not a regular file", "invalid_image")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            raise bad(where, f"the image file is {info.st_size:,} bytes, over the limit of "
                      f"{limit:,} bytes (--max-image-bytes)", "image_too_large")
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew while we read
        raise bad(where, f"the image file is over the limit of {limit:,} bytes "
                  "(--max-image-bytes)", "image_too_large")
    return data


__all__ = ["APIError", "local_path", "read_image_file"]
