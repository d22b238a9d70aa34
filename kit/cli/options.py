"""Options shared by several commands that are not engine knobs (those are in
:data:`kit.knobs.KNOBS`), and the checks ``serve`` and ``launch`` share."""

import typer

from kit.urls import DEFAULT_URL, URL_ENV

URL = typer.Option(None, "--url", envvar=URL_ENV, show_default=DEFAULT_URL,
                   help=f"Server URL, with or without /v1 (env {URL_ENV}).")


def check_cache_dir(folder: str | None, disk_bytes: int) -> None:
    """Refuse a ``--prompt-cache-dir`` that another user could have put a file in (not
    this user's, or writable by group or others, it or a folder above it; as ssh's
    StrictModes). On a filesystem that keeps no modes (an exFAT or FAT drive) only the
    owner counts: the engine then trusts each file by its MAC alone. The default folder
    is not refused here: the engine then runs without the disk tier, with a warning
    (:class:`kit.engine.cache.disk_cache.DiskCache`, for both).

    Raises:
        ConfigError: naming the folder and why.
    """
    from pathlib import Path

    from kit.engine.cache.safe_files import not_private
    from kit.errors import ConfigError

    if folder is None or disk_bytes <= 0:
        return
    problem = not_private(Path(folder).expanduser(), modeless_ok=True)
    if problem:
        raise ConfigError(
            f"refusing --prompt-cache-dir {folder}: {problem}; another user could plant a "
            "cache file there and have your prompts answered from it",
            hint="use a folder only you can write (chmod go-w, or 0700), or leave the flag "
                 "out for the default one")
